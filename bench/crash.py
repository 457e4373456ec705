"""Crash consistency: a training run killed with SIGKILL at random moments resumes to the weights of the
run that was never killed, and no kill leaves a run directory that cannot be used.

    python bench/crash.py --trials 20 --json crash.json        # a few minutes on 2 cores

It trains one small copy run to the end (the reference; one thread, fp32, so a resumed run must be
bitwise equal), with evaluations, checkpoints between them and checkpoint averaging, so that every
phase takes part: updates, validations, checkpoint writes and the writes of the averaged weights.
Then, for each trial, it starts the same run, kills it with SIGKILL after a random time drawn (with
a fixed seed) between the first update and the reference's end, and resumes it with `taskformer run
--resume` (or, where it died before its first checkpoint, starts it again with the same `--out`, as
the message says). Each trial passes when that command ends with exit 0, the final
`model.safetensors` equals the reference's tensor for tensor, the evaluations in `metrics.jsonl`
equal the reference's, and `taskformer predict` runs on the directory.

Where the kill landed is read from what it left: a temporary checkpoint folder (`checkpoint write`),
a temporary file among the averaged weights (`averaging write`), else `update or evaluation`.
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

SETTINGS = ["data.train_size=400", "data.val_size=16", "data.test_size=8", "train.max_steps=60", "train.eval_every=10",
            "train.save_every=4", "train.average_last=3", "train.keep_last=2", "train.threads=1", "train.bf16=false"]


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "taskformer", *args]


def train_args(out: Path, settings: list[str]) -> list[str]:
    return ["run", "copy", "--out", str(out), "--quiet", *(a for s in settings for a in ("--set", s))]


def evaluations(run: Path) -> list[dict]:
    """The eval events of ``metrics.jsonl`` without what depends on the clock."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if "second" not in k and k != "elapsed"} for row in rows
            if row.get("event") == "eval"]


def where_it_died(run: Path) -> str:
    checkpoints = run / "checkpoints"
    if checkpoints.is_dir() and any(p.name.startswith(".tmp") for p in checkpoints.iterdir()):
        return "checkpoint write"
    evaluated = checkpoints / "evaluated"
    if evaluated.is_dir() and any(p.name.startswith(".") for p in evaluated.iterdir()):
        return "averaging write"
    return "update or evaluation"


def same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(a), load_file(b)
    return x.keys() == y.keys() and all(x[k].equal(y[k]) for k in x)


def trial(root: Path, i: int, delay: float, reference: Path, settings: list[str], timeout: float) -> dict:
    out = root / f"trial-{i:02d}"
    started = time.monotonic()
    process = subprocess.Popen(command(*train_args(out, settings)), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # the delay counts from here, as the reference's moments
    try:
        process.wait(timeout=delay)
        killed = False  # it finished first: the trial still checks the result
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        process.wait()
        killed = True
    row = {"trial": i, "killed_after_s": round(time.monotonic() - started, 2), "killed": killed,
           "phase": where_it_died(out) if killed and out.exists() else "-"}
    checkpoint = out.exists() and any((out / "checkpoints").glob("step-*"))
    again = command("run", "--resume", str(out), "--quiet") if checkpoint else command(*train_args(out, settings))
    if not killed or (out / "result.json").exists():  # killed while it drew its report: nothing to resume
        row.update(how="results written before the kill", rc=0)
    else:
        done = subprocess.run(again, capture_output=True, text=True, timeout=timeout)
        row.update(how="resume" if checkpoint else "start again", rc=done.returncode,
                   error=done.stderr.strip().splitlines()[-1] if done.returncode else "")
    ok = row["rc"] == 0 and (out / "model.safetensors").is_file()
    row["same_weights"] = ok and same_weights(out / "model.safetensors", reference / "model.safetensors")
    row["same_evaluations"] = ok and evaluations(out) == evaluations(reference)
    usable = subprocess.run(command("predict", str(out), "1 2 3"), capture_output=True, text=True, timeout=timeout)
    row["usable"] = usable.returncode == 0
    row["passed"] = row["same_weights"] and row["same_evaluations"] and row["usable"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="kills, each resumed (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
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
        started = time.monotonic()
        process = subprocess.Popen(command(*train_args(reference, settings)), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
        moments = {}  # when the run's config.json (training is next) and its result.json appeared
        while process.poll() is None:
            for name in ("config.json", "result.json"):
                if name not in moments and (reference / name).exists():
                    moments[name] = time.monotonic() - started
            time.sleep(0.02)
        if process.returncode != 0 or len(moments) < 2:
            sys.exit(f"the reference run failed: {process.stderr.read()}")
        first, end = moments["config.json"], moments["result.json"]
        print(f"reference: {' '.join(settings)}; training from {first:.1f} s, results written at {end:.1f} s",
              flush=True)
        draw = random.Random(args.seed)
        rows = []
        for i in range(args.trials):
            row = trial(root, i, draw.uniform(first, end), reference, settings, args.timeout)
            rows.append(row)
            print(json.dumps(row), flush=True)
        passed = sum(r["passed"] for r in rows)
        phases = {p: sum(r["phase"] == p for r in rows) for p in sorted({r["phase"] for r in rows})}
        print(f"{passed} of {len(rows)} trials passed (same weights, same evaluations, usable); kills by phase: "
              f"{', '.join(f'{p} {n}' for p, n in phases.items())}; "
              f"{sum(r['how'] == 'results written before the kill' for r in rows)} wrote their results before the "
              "kill", flush=True)
        if args.json:
            args.json.write_text(json.dumps({"settings": settings, "cpu": os.cpu_count(), "trials": rows,
                                             "passed": passed}, indent=2))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
