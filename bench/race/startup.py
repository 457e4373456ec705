"""How fast the first commands start: ``taskformer tasks`` (every plugin listed) and ``taskformer --help``
against a bare ``python -c pass``, each run as a fresh process, alternating, median of the rounds.

The installed ``taskformer`` console script is what a user types; it must start in well under a
second (it imports no torch: tests/test_layers.py checks that).

    python bench/race/startup.py [--rounds 15]
"""
from __future__ import annotations

import argparse
import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py

from machine import alternate, cpu_name, timed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    script = shutil.which("taskformer") or sys.exit("no taskformer console script on PATH: activate the venv")
    commands = {"python -c pass": [sys.executable, "-c", "pass"], "taskformer tasks": [script, "tasks"],
                "taskformer --help": [script, "--help"]}

    def run(name: str, cmd: list[str]) -> float:
        return timed(functools.partial(subprocess.run, check=True, stdout=subprocess.DEVNULL), cmd)

    run("warm-up", commands["taskformer tasks"])  # the first run reads the files from disk
    seconds = alternate(commands, run, args.rounds)
    bare = seconds["python -c pass"]
    print(json.dumps({"cpu": cpu_name(), "rounds": args.rounds,
                      "median_seconds": {k: round(v, 3) for k, v in seconds.items()},
                      "times_python": {k: round(v / bare, 1) for k, v in seconds.items() if k != "python -c pass"}},
                     indent=2))


if __name__ == "__main__":
    main()
