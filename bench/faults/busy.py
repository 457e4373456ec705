"""A command on a busy machine: every core kept busy for the command's first seconds, then left alone.

    python bench/faults/busy.py --seconds 120 --json --result runs/busy -- taskformer run translate-de-en \
        --data ../shared/datasets/multi30k --time-limit 5 --out runs/busy

Spinning child processes (one per core unless --workers says otherwise) start with the command and
are stopped after --seconds; the command's own output passes through, and its wall time, the load's
and the machine are printed at the end (as JSON with --json); with --result RUN_DIR, also the run's
test metrics and how it used its limit (result.json's info.clock: the pace before training and over
the run, the share of the limit used, the final evaluation's estimate and its measured time). This is the condition a time limit
must survive: a build or a test suite busy for the first minutes of a run, then nothing else.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py

from machine import cpu_name  # noqa: E402


def spin() -> None:
    """Keep one core busy until terminated."""
    x = 0
    while True:
        x = (x * 31 + 7) % 1_000_003


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long the cores are kept busy (default 120)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="spinning processes (default: cores)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    parser.add_argument("--result", help="the command's run directory: add its result.json's figures")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...: what to run")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(max(args.workers, 0))]
    for p in spinners:
        p.start()
    began = time.monotonic()  # the command's wall time, and the busy stretch, count from its start
    busy_until = began + args.seconds
    try:
        process = subprocess.Popen(command)
        while process.poll() is None:
            if spinners and time.monotonic() >= busy_until:
                stop(spinners)
                spinners = []
            time.sleep(0.1)
    finally:
        stop(spinners)
    wall = time.monotonic() - began
    figures = {"command": command, "returncode": process.returncode, "wall_seconds": round(wall, 1),
               "busy_seconds": min(args.seconds, wall), "busy_workers": args.workers, "cpu": cpu_name(),
               "cores": os.cpu_count()}
    if args.result:
        figures.update(run_figures(args.result))
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"wall time {wall:.1f} s; {args.workers} spinning processes for the first "
              f"{figures['busy_seconds']:.0f} s; exit code {process.returncode}; {figures['cpu']}", file=sys.stderr)
    return process.returncode


def run_figures(run_dir: str) -> dict:
    """The test metrics and the clock's record of a finished run (``{}`` where it wrote no result)."""
    try:
        with open(os.path.join(run_dir, "result.json")) as f:
            result = json.load(f)
    except (OSError, ValueError):
        return {}
    info = result.get("info", {})
    return {"test": result.get("metrics", {}).get("test"), "clock": info.get("clock"), "steps": info.get("steps"),
            "stopped": info.get("stopped")}


def stop(spinners: list[multiprocessing.Process]) -> None:
    """End the spinning processes (started here) and wait for them."""
    for p in spinners:
        p.terminate()
    for p in spinners:
        p.join()


if __name__ == "__main__":
    sys.exit(main())
