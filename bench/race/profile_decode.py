"""Where a decode's time goes: torch's profiler over one of bench/workload.py's decoding workloads.

    python bench/race/profile_decode.py                      # greedy and beam 5, batch 128 and batch 1, fp32
    python bench/race/profile_decode.py --quantize int8 --rows 12

The bench's network (d256 3+3, vocabulary 8,000) decodes Multi30k val sources for exactly 24 steps
(EOS ignored), through the copy that taskformer decodes with, on one thread: one batch of 128
sentences, or 16 sentences one at a time. Printed per workload: the wall time per step and the ops
with the largest self CPU time, as shares. A profile, not a timing: the profiler's own overhead
counts most at batch 1.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py

import workload  # noqa: E402
from taskformer.app.resources import keep_freed_memory  # noqa: E402
from taskformer.core import inference  # noqa: E402
from taskformer.core.data import pad  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quantize", default="none", choices=inference.QUANTIZE, help="decode.quantize")
    parser.add_argument("--rows", type=int, default=8, help="ops shown per workload")
    args = parser.parse_args()
    keep_freed_memory()
    torch.set_num_threads(1)
    _, _, val = workload.multi30k(2000)
    model = inference.for_decoding(workload.make_taskformer(False)[0].eval(), args.quantize)
    order = sorted(range(128), key=lambda i: len(val[i]))
    workloads = {"batch 128": [pad([val[j] for j in order])], "batch 1": [pad([val[j]]) for j in order[:16]]}
    for search in ("greedy", "beam5"):
        for name, batches in workloads.items():
            def work(batches: list, search: str) -> None:
                for batch in batches:
                    workload.decode_fixed(model, batch, search)
            work(batches, search)  # warm-up
            started = time.perf_counter()
            work(batches, search)
            per_step = (time.perf_counter() - started) / len(batches) / workload.L
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                work(batches, search)
            events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
            total = sum(e.self_cpu_time_total for e in events)
            print(f"{search}, {name}, {args.quantize}: {1000 * per_step:.2f} ms a step")
            for e in events[: args.rows]:
                print(f"  {100 * e.self_cpu_time_total / total:5.1f}%  {e.key}")


if __name__ == "__main__":
    main()
