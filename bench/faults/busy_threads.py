"""Training updates per second on fewer and more of torch's threads while other processes keep the cores
busy: does a thread that waits for no other beat several that wait for each other on busy cores?

One process trains bench/workload.py's network (the engine's own update, fp32) on random batches,
changing torch's threads in turn (as core/cores.py does during a run) and timing each count for
``--seconds``; ``--spinners`` processes (default: one per core, busy.py's) spin
meanwhile, 0 for none. Each round prints updates/s and the cores the process used, per count.

    python bench/faults/busy_threads.py --seconds 6 --rounds 2              # about 30 s
    python bench/faults/busy_threads.py --spinners 0 --threads 1 2          # the same with nothing spinning
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

import torch

from taskformer.core.model import PAD

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py

from busy import spin, stop  # noqa: E402  (beside this file)

from machine import cpu_name  # noqa: E402
from workload import V, make_taskformer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="seconds timed per thread count and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, nargs="+", default=[os.cpu_count() or 1, 1])
    parser.add_argument("--spinners", type=int, default=os.cpu_count() or 1, help="busy processes (default: cores)")
    parser.add_argument("--batch", type=int, nargs=2, default=[32, 20], metavar=("SENTENCES", "TOKENS"))
    args = parser.parse_args()
    _, step = make_taskformer(bf16=False)
    sentences, tokens = args.batch
    src = torch.randint(PAD + 4, V, (sentences, tokens))
    tgt = torch.randint(PAD + 4, V, (sentences, tokens + 1))
    step(src, tgt)  # untimed: the first update's one-time costs
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.spinners)]
    for p in spinners:
        p.start()
    print(f"{cpu_name()}, {os.cpu_count()} cores, {args.spinners} spinning processes, load {os.getloadavg()[0]:.1f}")
    try:
        for round_ in range(args.rounds):
            for threads in args.threads:
                torch.set_num_threads(threads)
                began, cpu, updates = time.monotonic(), time.process_time(), 0
                while time.monotonic() - began < args.seconds:
                    step(src, tgt)
                    updates += 1
                wall = time.monotonic() - began
                print(f"round {round_ + 1}, {threads} thread(s): {updates / wall:.2f} updates/s, "
                      f"{(time.process_time() - cpu) / wall:.2f} cores used", flush=True)
    finally:
        stop(spinners)
    return 0


if __name__ == "__main__":
    sys.exit(main())
