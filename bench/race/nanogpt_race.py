"""nanoGPT against taskformer on Tiny Shakespeare: the same network, data and updates, then the same wall clock.

nanoGPT (../shared/bench/nanogpt, its own code) runs as a subprocess from a writable temporary copy,
which prepares its character data from the same file (its own prepare.py); nothing of it is
imported here. Both train its CPU recipe: 4 layers, 4 heads, width 128, context 64, 12 blocks a
batch, no dropout, 2,000 updates, a peak rate of 1e-3 after 100 warm-up updates, AdamW's weight
decay 0.1 and gradients clipped at 1. What our options cannot match: nanoGPT decays the rate along
a cosine to 1e-4 (ours falls linearly to 0), its Adam's beta2 is 0.99 (ours 0.98), it learns its
positions (ours are sinusoidal), its layers have no biases, and it draws every block at a random
offset (ours cuts the text into consecutive blocks from another offset each epoch). nanoGPT's val
loss is its own estimate (``--eval_iters`` random blocks of train and of val, every 250 updates),
ours is over every val block (every 500 updates, the task's default).

    python bench/race/nanogpt_race.py                      # both modes, the full recipe (minutes)
    python bench/race/nanogpt_race.py --iters 20 --mode updates   # a smoke run of the script itself
    python bench/race/nanogpt_race.py --mode updates --threads 2

``updates``: the recipe in both, tokens per second of each (training tokens over the seconds of the
training loop, its evaluations included), their ratio and each val loss. ``wall-clock``: the task's
defaults with ``--time-limit`` set to the minutes nanoGPT's run took (no step cap: the clock is the
budget), and each val loss. ``--time-limit`` covers our whole command, start and final evaluation
included, as nanoGPT's minutes do; a smoke run's few seconds are too short for it (use ``--mode updates``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py
from machine import cpu_name  # noqa: E402

BATCH, BLOCK = 12, 64


def nanogpt(source: Path, data: Path, work: Path, iters: int, eval_iters: int, env: dict) -> dict:
    """Train nanoGPT's CPU recipe in a copy of it under ``work``; its log's figures."""
    copy = work / "nanogpt"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("*.bin", "*.pkl", "out-*", "__pycache__"))
    subprocess.run([sys.executable, "data/shakespeare_char/prepare.py", str(data / "input.txt.gz")], cwd=copy,
                   check=True, env=env, stdout=subprocess.DEVNULL)
    args = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", f"--eval_iters={eval_iters}",
            "--log_interval=1", f"--block_size={BLOCK}", f"--batch_size={BATCH}", "--n_layer=4", "--n_head=4",
            "--n_embd=128", f"--max_iters={iters}", f"--lr_decay_iters={iters}", "--dropout=0.0",
            f"--eval_interval={min(250, iters)}", f"--out_dir={work / 'nanogpt-out'}"]
    started = time.monotonic()
    log = subprocess.run([sys.executable, "train.py", *args], cwd=copy, check=True, env=env, capture_output=True,
                         text=True).stdout
    wall = time.monotonic() - started
    steps = [float(ms) / 1000 for ms in re.findall(r"^iter \d+: loss [\d.]+, time ([\d.]+)ms", log, flags=re.M)]
    val = re.findall(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)", log, flags=re.M)
    updates = len(steps)  # nanoGPT runs iterations 0 .. max_iters
    return {"updates": updates, "train_seconds": sum(steps), "wall_seconds": wall,
            "tokens_per_s": updates * BATCH * BLOCK / sum(steps), "val_loss": float(val[-1][1])}


def ours(data: Path, out: Path, settings: list[str], time_limit: float | None, env: dict) -> dict:
    """Train the shakespeare-char task with ``settings``; the figures of its result.json."""
    command = [sys.executable, "-m", "taskformer", "run", "shakespeare-char", "--data-dir", str(data), "--out",
               str(out), "--quiet", *(f"--set={s}" for s in settings)]
    if time_limit:
        command += ["--time-limit", f"{time_limit:.4f}"]
    started = time.monotonic()
    if subprocess.run(command, env=env, stdout=subprocess.DEVNULL).returncode:
        raise SystemExit(f"taskformer run failed (its error is above): {' '.join(command)}")
    wall = time.monotonic() - started
    result = json.loads((out / "result.json").read_text())
    info = result["info"]
    return {"updates": info["steps"], "train_seconds": info["train_seconds"], "wall_seconds": wall,
            "tokens_per_s": info["tokens_per_s"], "val_loss": result["metrics"]["val"]["loss"],
            "precision": info["precision"]}


def show(name: str, figures: dict) -> None:
    print(f"  {name:<11} {figures['updates']:>6,} updates  {figures['train_seconds']:8.1f} s training  "
          f"{figures['wall_seconds']:8.1f} s wall  {figures['tokens_per_s']:>9,.0f} tok/s  "
          f"val loss {figures['val_loss']:.4f}" + (f"  ({figures['precision']})" if "precision" in figures else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("updates", "wall-clock", "both"), default="both")
    parser.add_argument("--iters", type=int, default=2000, help="nanoGPT's max_iters and our train.max_steps")
    parser.add_argument("--eval-iters", type=int, default=20, help="nanoGPT's val batches per estimate (its README's "
                        "CPU recipe: 20)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads of both (0: torch's choice, both alike)")
    parser.add_argument("--data", type=Path, default=Path("../shared/datasets/tinyshakespeare"),
                        help="the folder of input.txt.gz (default: from the repository root)")
    parser.add_argument("--nanogpt", type=Path, default=Path("../shared/bench/nanogpt"), help="nanoGPT's folder")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (runs and logs)")
    args = parser.parse_args()
    args.data, args.nanogpt = args.data.resolve(), args.nanogpt.resolve()  # the runs work in another folder
    env = dict(os.environ)
    if args.threads:
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    threads = [f"train.threads={args.threads}"] if args.threads else []
    work = Path(tempfile.mkdtemp(prefix="nanogpt-race-"))
    print(f"nanoGPT against taskformer on Tiny Shakespeare, {cpu_name()}, {os.cpu_count()} cores, "
          f"threads {args.threads or 'torch default'}, {args.iters:,} updates of {BATCH} x {BLOCK} tokens")
    try:
        theirs = nanogpt(args.nanogpt, args.data, work, args.iters, args.eval_iters, env)
        if args.mode in ("updates", "both"):
            mine = ours(args.data, work / "updates", [f"train.max_steps={args.iters}", *threads], None, env)
            print("same network, data and updates:")
            show("nanoGPT", theirs)
            show("taskformer", mine)
            print(f"  tokens/s ratio (taskformer / nanoGPT): {mine['tokens_per_s'] / theirs['tokens_per_s']:.2f}; "
                  f"val loss difference: {mine['val_loss'] - theirs['val_loss']:+.4f}")
        if args.mode in ("wall-clock", "both"):
            minutes = theirs["wall_seconds"] / 60
            mine = ours(args.data, work / "wall-clock", ["train.max_steps=0", *threads], minutes, env)
            print(f"same wall clock (--time-limit {minutes:.2f}, nanoGPT's whole run):")
            show("nanoGPT", theirs)
            show("taskformer", mine)
            print(f"  val loss difference (taskformer - nanoGPT): {mine['val_loss'] - theirs['val_loss']:+.4f}")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
