"""The first ten minutes of a new user, timed as they live them: each short run of README's journeys
as a whole command (start, data, probe, training, final evaluation, report), its wall time against
its --time-limit, its test score, and when training began.

    python bench/study/first_minutes.py --data ../shared/datasets --out runs/first-minutes [--only agnews]

Journeys (the goals in docs/results.md): translate-de-en 5 minutes, agnews 1 minute, couplet 5
minutes twice (the second reads its prepared data from the cache). Run it alone on the machine: each
journey is a time-limited run, so anything else running takes updates from it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py

from machine import cpu_name  # noqa: E402

JOURNEYS = {  # name -> (task, data folder, minutes)
    "translate-de-en": ("translate-de-en", "multi30k", 5),
    "agnews": ("agnews", "ag_news", 1),
    "couplet": ("couplet", "couplets", 5),
    "couplet-again": ("couplet", "couplets", 5),
}


def journey(task: str, data: Path, minutes: float, out: Path, cache: Path) -> dict:
    """One ``taskformer run`` as a subprocess with its log read back: wall time, when training began."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "taskformer", "run", task, "--data-dir", str(data), "--out", str(out),
                           "--time-limit", str(minutes)], capture_output=True, text=True,
                          env={**os.environ, "TASKFORMER_CACHE": str(cache)})
    wall = time.monotonic() - started
    if proc.returncode:
        return {"task": task, "error": proc.stderr.strip().splitlines()[-1:], "wall_seconds": round(wall, 1)}
    result = json.loads((out / "result.json").read_text())
    first = re.search(r"training: first update done ([0-9.]+) s after the command started", proc.stderr)
    return {"task": task, "minutes": minutes, "wall_seconds": round(wall, 1),
            "within_limit": wall <= minutes * 60, "test": result["metrics"]["test"], "val": result["metrics"]["val"],
            "steps": result["info"]["steps"], "recipe": result["info"].get("recipe", {}).get("why"),
            "stopped": result["info"]["stopped"], "first_update_after_seconds": float(first[1]) if first else None,
            "outputs": [row["output"] for row in map(json.loads, (out / "outputs-test.jsonl").read_text().splitlines())]}


def repeats_one_character(line: str) -> bool:
    """A line that is one character over and over (the undertrained couplet's 柳柳柳柳柳柳柳)."""
    chars = [c for c in line if not c.isspace()]
    return len(chars) > 1 and len(set(chars)) == 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the folder of the data sets (../shared/datasets)")
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the runs and results.json")
    parser.add_argument("--only", nargs="*", choices=list(JOURNEYS), help="some journeys only")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=False)
    cache = Path(tempfile.mkdtemp(prefix="first-minutes-cache-"))  # a new user's empty cache
    rows = {}
    for name in args.only or JOURNEYS:
        task, folder, minutes = JOURNEYS[name]
        row = journey(task, args.data / folder, minutes, args.out / name, cache)
        outputs = row.pop("outputs", [])
        if task == "couplet":
            row["outputs_repeating_one_character"] = sum(map(repeats_one_character, outputs))
        rows[name] = row
        print(json.dumps({name: row}, ensure_ascii=False), flush=True)
    record = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "journeys": rows}
    (args.out / "results.json").write_text(json.dumps(record, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
