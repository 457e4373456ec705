"""A training step through TorchInductor against the eager one: target tokens/s, side by side.

    python bench/race/compiled_training.py            # 3 rounds of 8 updates each, on real Multi30k batches
    python bench/race/compiled_training.py --quick

bench/race/speed.py's network (the translate-de-en default's shape) and the engine's own update (label
smoothing, clipping, AdamW), in bf16 where bf16 is native and fp32 always. The compiled contender is
the same model after ``nn.Module.compile(dynamic=True)`` (the batches' lengths vary: one graph for
all of them, not one per shape); its compile is done in a warm-up over every batch before the
clock runs and reported apart.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py
from machine import alternate, cpu_name, timed  # noqa: E402
from taskformer.core import precision  # noqa: E402
from taskformer.core.data import pad, token_batches  # noqa: E402
from workload import PAD, make_taskformer, multi30k  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds, steps = (1, 2) if args.quick else (3, 8)
    src, tgt, _ = multi30k(2000 if args.quick else 29000)
    lengths = [max(len(s), len(t)) for s, t in zip(src, tgt)]
    batches = [(pad([src[i] for i in b]), pad([tgt[i] for i in b]))
               for b in token_batches(lengths, 4096, seed=0)[: steps]]
    native, _ = precision.bf16_native("cpu")
    result = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__}
    for name in ("bf16", "fp32") if native else ("fp32",):
        contenders, compile_seconds = {}, 0.0
        for kind in ("eager", "compiled"):
            model, step = make_taskformer(name == "bf16")
            if kind == "compiled":
                model.compile(dynamic=True)
                started = time.perf_counter()
                for s, t in batches:
                    step(s, t)
                compile_seconds = time.perf_counter() - started
            else:
                step(*batches[0])
            contenders[kind] = step
        tokens = sum(int((t[:, 1:] != PAD).sum()) for _, t in batches)

        def work(kind, step):
            return timed(lambda: [step(s, t) for s, t in batches])
        rates = {kind: tokens / s for kind, s in alternate(contenders, work, rounds).items()}
        result[name] = {"tokens_per_s": rates, "compiled_over_eager": rates["compiled"] / rates["eager"],
                        "first_pass_with_compile_s": round(compile_seconds, 1)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
