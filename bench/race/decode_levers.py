"""Two decoding levers measured against what taskformer does (neither adopted; docs/benchmarks.md says why).

    python bench/race/decode_levers.py [--sentences 60] [--rounds 3] [--json out.json]

bench/race/speed.py's network (``workload``: d256 3+3, vocabulary 8,000) decodes Multi30k val sources
greedily for exactly 24 steps (EOS ignored), at batch 1 (``--sentences`` sentences one at a time) and
at batch 128 (1,000 sentences, longest first), in alternating rounds (the median of each):

1. **a compiled step**: ``torch.compile`` (inductor, ``freezing`` so that it packs the weights itself,
   dynamic shapes for the growing cache) of the model's ``decode`` against the copy with pre-packed
   linear layers that taskformer decodes with; one thread. Reported with its compile time and
   whether its outputs equal the copy's.
2. **worker processes**: two forked processes of one thread each, against taskformer's two worker
   threads (``decoding.parallel_map``).
"""
from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import multiprocessing
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._inductor.config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py

import workload  # noqa: E402
from machine import alternate, cpu_name, timed  # noqa: E402
from taskformer.app.resources import keep_freed_memory  # noqa: E402
from taskformer.core import decoding, inference  # noqa: E402
from taskformer.core.data import pad  # noqa: E402

_WORK: Callable[[int], Any] | None = None  # what a forked worker runs: set before the pool forks, so nothing is
                                         # pickled but an index


def _forked(i: int):
    torch.set_num_threads(1)
    assert _WORK is not None
    return _WORK(i)


def forked_map(fn, items: list, workers: int) -> list:
    """``map(fn, items)`` over ``workers`` forked processes, results in order."""
    global _WORK
    _WORK = lambda i: fn(items[i])  # noqa: E731
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return list(pool.imap(_forked, range(len(items))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=60, help="sentences decoded one at a time")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    keep_freed_memory()
    _, _, val = workload.multi30k(2000)
    model = workload.make_taskformer(False)[0].eval()
    packed = inference.for_decoding(model, "none")
    order = sorted(range(1000), key=lambda i: -len(val[i]))
    loads = {"batch 1": [pad([val[j]]) for j in order[: args.sentences]],
             "batch 128": [pad([val[j] for j in order[i : i + 128]]) for i in range(0, 1000, 128)]}

    @torch.inference_mode()
    def one(m, batch):
        return workload.decode_fixed(m, batch, "greedy")

    torch.set_num_threads(1)
    torch._inductor.config.freezing = True
    compiled = copy.copy(model)  # shares the weights; only ``decode`` is replaced
    compiled.decode = torch.compile(model.decode, dynamic=True)
    compile_s = timed(lambda: [one(compiled, b) for b in loads["batch 1"][:2] + loads["batch 128"][:1]])

    def decoders(batches: list) -> dict:
        """The four ways to decode ``batches``: each a function of nothing that returns the outputs."""
        def packed_one(batch):
            return one(packed, batch)
        return {
            "packed copy, 1 thread": lambda: [one(packed, batch) for batch in batches],
            "compiled step, 1 thread": lambda: [one(compiled, batch) for batch in batches],
            "packed copy, 2 worker threads": lambda: list(decoding.parallel_map(packed_one, batches, 2)),
            "packed copy, 2 worker processes": lambda: forked_map(packed_one, batches, 2),
        }

    outputs: dict[str, list] = {}  # the last outputs of each decoder, for the current workload

    def work(key, fn) -> float:
        torch.set_num_threads(1)
        return timed(lambda: outputs.__setitem__(key, fn()))

    results: dict = {"compile_s": round(compile_s, 1)}
    for name, batches in loads.items():
        n = sum(batch.size(0) for batch in batches)
        outputs.clear()
        speed = {k: n / secs for k, secs in alternate(decoders(batches), work, args.rounds).items()}
        results[name] = {
            "sentences_per_s": {k: round(v, 1) for k, v in speed.items()},
            "compiled / packed": round(speed["compiled step, 1 thread"] / speed["packed copy, 1 thread"], 2),
            "processes / threads": round(speed["packed copy, 2 worker processes"]
                                         / speed["packed copy, 2 worker threads"], 2),
            "compiled outputs equal": outputs["compiled step, 1 thread"] == outputs["packed copy, 1 thread"],
        }
        print(name, json.dumps(results[name], indent=1), flush=True)
    results |= {"cpu": f"{cpu_name()} ({torch.backends.cpu.get_cpu_capability()})", "torch": torch.__version__,
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="minutes")}
    print(f"compile: {compile_s:.1f} s; {results['cpu']}, torch {results['torch']}, {results['date']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
