"""Crash consistency: a training run killed with SIGKILL at random moments resumes to the weights of the
run that was never killed, and no kill leaves a run directory that cannot be used.

    python bench/faults/crash.py --trials 20 --json crash.json        # a few minutes on 2 cores

It trains one small copy run to the end (the reference; one thread, fp32, so a resumed run must be
bitwise equal), with evaluations, checkpoints between them and checkpoint averaging, so that every
moment of training takes part. The trials take the four moments in turn: an update, an evaluation,
the averaging (keeping the evaluated weights, evaluating their mean) and a checkpoint write. A
moment a few milliseconds long is rarely hit by a kill at a random time, so the kill is placed in
the run's own progress instead (tests/killpoint.py): the reference counts the function calls and
returns of each occurrence of each moment, and a trial draws (with a fixed seed) an occurrence and
a call in it, and the run is killed with SIGKILL there. Each killed run is resumed with
`taskformer run --resume` (or, where it died before its first checkpoint, started again with the
same `--out`, as the message says). A trial passes when that command ends with exit 0, the final
`model.safetensors` equals the reference's tensor for tensor, the evaluations in `metrics.jsonl`
equal the reference's, and `taskformer predict` runs on the directory.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from safetensors.torch import load_file

KILLPOINT = Path(__file__).resolve().parents[2] / "tests" / "killpoint.py"
MOMENTS = ("update", "evaluation", "averaging", "checkpoint")
SETTINGS = ["data.train_size=400", "data.val_size=16", "data.test_size=8", "train.epochs=0", "train.max_steps=60",
            "train.eval_every=10", "train.save_every=4", "train.average_last=3", "train.keep_last=2", "train.threads=1",
            "train.bf16=false"]


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "taskformer", *args]


def train_args(out: Path, settings: list[str]) -> list[str]:
    return ["run", "copy", "--out", str(out), "--quiet", *(a for s in settings for a in ("--set", s))]


def evaluations(run: Path) -> list[dict]:
    """The eval events of ``metrics.jsonl`` without what depends on the clock."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if "second" not in k and k != "elapsed"} for row in rows
            if row.get("event") == "eval"]


def same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(a), load_file(b)
    return x.keys() == y.keys() and all(x[k].equal(y[k]) for k in x)


def trial(root: Path, i: int, point: str, reference: Path, settings: list[str], timeout: float) -> dict:
    out = root / f"trial-{i:02d}"
    killed = subprocess.run([sys.executable, str(KILLPOINT), "--kill", point, *train_args(out, settings)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout)
    where = [line for line in killed.stderr.splitlines() if line.startswith("killpoint: ")]
    row = {"trial": i, "point": point, "killed": killed.returncode == -signal.SIGKILL,
           "where": where[-1].removeprefix("killpoint: ") if where else "-"}
    checkpoint = out.exists() and any((out / "checkpoints").glob("step-*"))
    again = command("run", "--resume", str(out), "--quiet") if checkpoint else command(*train_args(out, settings))
    if not row["killed"]:  # the point was not reached: the trial still checks the result
        row.update(how="not killed", rc=killed.returncode)
    else:
        done = subprocess.run(again, capture_output=True, text=True, timeout=timeout)
        row.update(how="resume" if checkpoint else "start again", rc=done.returncode,
                   error=done.stderr.strip().splitlines()[-1] if done.returncode else "")
    ok = row["rc"] == 0 and (out / "model.safetensors").is_file()
    row["same_weights"] = ok and same_weights(out / "model.safetensors", reference / "model.safetensors")
    row["same_evaluations"] = ok and evaluations(out) == evaluations(reference)
    usable = subprocess.run(command("predict", str(out), "1 2 3"), capture_output=True, text=True, timeout=timeout)
    row["usable"] = usable.returncode == 0
    row["passed"] = row["killed"] and row["same_weights"] and row["same_evaluations"] and row["usable"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="kills, each resumed (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill points")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="change a setting of the run (e.g. train.max_steps=8 for a smoke run)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a resume may take")
    parser.add_argument("--keep", type=Path, help="keep the run directories here")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    settings = SETTINGS + args.settings
    root = Path(tempfile.mkdtemp(prefix="taskformer-crash-")) if args.keep is None else args.keep
    root.mkdir(parents=True, exist_ok=True)
    try:
        reference = root / "reference"
        counts = root / "events.json"
        started = time.monotonic()
        made = subprocess.run([sys.executable, str(KILLPOINT), "--count", str(counts), *train_args(reference, settings)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if made.returncode != 0:
            sys.exit(f"the reference run failed: {made.stderr}")
        events = json.loads(counts.read_text())  # moment -> the calls and returns of each of its occurrences
        print(f"reference: {' '.join(settings)}; {time.monotonic() - started:.1f} s counted; occurrences: "
              f"{', '.join(f'{m} {len(events[m])}' for m in MOMENTS)}", flush=True)
        draw = random.Random(args.seed)
        moments = [m for m in MOMENTS if events[m]]  # e.g. no averaging with train.average_last=0
        rows = []
        for i in range(args.trials):
            moment = moments[i % len(moments)]
            n = draw.randrange(len(events[moment]))
            point = f"{moment}:{n + 1}:{draw.randint(1, events[moment][n])}"
            row = trial(root, i, point, reference, settings, args.timeout)
            rows.append(row)
            print(json.dumps(row), flush=True)
        passed = sum(r["passed"] for r in rows)
        by_moment = {m: sum(r["killed"] and r["point"].startswith(m + ":") for r in rows) for m in moments}
        print(f"{passed} of {len(rows)} trials passed (killed, same weights, same evaluations, usable); kills in "
              f"{', '.join(f'{m} {n}' for m, n in by_moment.items())}; "
              f"{sum(r['how'] == 'start again' for r in rows)} before the first checkpoint (started again)", flush=True)
        if args.json:
            args.json.write_text(json.dumps({"settings": settings, "cpu": os.cpu_count(), "trials": rows,
                                             "passed": passed}, indent=2))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
