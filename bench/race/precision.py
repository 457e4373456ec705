"""Does the automatic precision pay? The documented translate command with its defaults against fp32.

Runs ``taskformer run translate-de-en --data-dir DATA --set train.max_steps=N`` with the defaults
(``train.bf16=auto``) and with ``--set train.bf16=false``, alternating A B A B, and compares the
training throughput each run records (target tokens/s, from ``result.json``). Where bf16 is not
native the two runs train the same way and the ratio should be ~1.0; where it is native, bf16 should
win clearly.

    python bench/race/precision.py [--data-dir ../shared/datasets/multi30k] [--steps 20] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py

from machine import cpu_name, forced_isa  # noqa: E402
from taskformer.core import precision  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def run(data_dir: Path, steps: int, extra: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "taskformer", "run", "translate-de-en", "--data-dir", str(data_dir),
           "--out", str(out), "--quiet", "--set", f"train.max_steps={steps}", *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "result.json").read_text())["info"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "datasets" / "multi30k")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    variants = {"defaults": [], "train.bf16=false": ["--set", "train.bf16=false"]}
    speeds: dict[str, list] = {name: [] for name in variants}
    chosen = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, extra in variants.items():
                info = run(args.data_dir, args.steps, extra, Path(tmp) / f"{r}-{len(speeds[name])}-{name}")
                speeds[name].append(info["tokens_per_s"])
                chosen[name] = info.get("precision", "?")
                print(f"round {r + 1} {name}: {info['tokens_per_s']:,} tok/s ({chosen[name]})", file=sys.stderr)
    native, why = precision.bf16_native("cpu")
    cpu = cpu_name()
    forced = " ".join(f"{k}={v}" for k, v in forced_isa().items())
    med = {name: statistics.median(v) for name, v in speeds.items()}
    print(f"CPU: {cpu} ({torch.backends.cpu.get_cpu_capability()}{'; ' + forced if forced else ''}), "
          f"{torch.get_num_threads()} threads; bf16 native: {native} ({why})")
    for name, v in med.items():
        print(f"{name:>18}: {v:,.0f} target tok/s (median of {len(speeds[name])}; {chosen[name]})")
    print(f"defaults / fp32 = {med['defaults'] / med['train.bf16=false']:.2f}x "
          f"(bar: >= 0.9x everywhere, >= 1.3x where bf16 is native)")


if __name__ == "__main__":
    main()
