"""Decode speed of whichever taskformer is imported, for a before/after comparison of a change.

bench/race/speed.py's network, seeded random weights, 512 sources of random tokens (lengths 8..30), 24
steps each (EOS ignored), fp32, the CLI's workers (one batch per thread). Prints one JSON line of
sentences/s: greedy and beam 5, batch 1 and batch 128. For the "before" side, make a link tree of
an older commit's worktree (as installed: taskformer/ with core, plugins and tasks linked into it)
and put it first on PYTHONPATH; run the two sides in turn, a few times each:

    git worktree add /tmp/before REV && mkdir -p /tmp/pkg/taskformer && cp -r /tmp/before/taskformer/* /tmp/pkg/taskformer/
    for d in core plugins tasks; do ln -s /tmp/before/$d /tmp/pkg/taskformer/$d; done
    for r in 1 2 3; do (cd /tmp && PYTHONPATH=/tmp/pkg python $OLDPWD/bench/decode_before_after.py); \
                       python bench/race/decode_before_after.py; done
"""
import json
import time
from typing import Any

import torch

from taskformer.core import decoding, inference
from taskformer.core.data import pad
from taskformer.core.model import EOS, Transformer
from taskformer.core.model_config import ModelConfig

SHAPE: dict[str, Any] = dict(vocab_size=8000, d_model=256, n_heads=8, enc_layers=3, dec_layers=3, d_ff=1024, dropout=0.1,
             tie_embeddings=False, max_len=128)


def sources(n: int = 512) -> list[list[int]]:
    """``n`` sources of random tokens, 8 to 30 long and ending with EOS, longest first (as the CLI sorts)."""
    g, out = torch.Generator().manual_seed(1), []
    for _ in range(n):
        length = int(torch.randint(8, 31, (1,), generator=g))
        out.append(torch.randint(4, int(SHAPE["vocab_size"]), (length,), generator=g).tolist() + [EOS])
    return sorted(out, key=len, reverse=True)


def speed(model, srcs: list[list[int]], size: int, n: int, search: str) -> float:
    """Sentences/s of ``n`` sources decoded in batches of ``size`` by the CLI's workers."""
    batches = [pad(srcs[i : i + size]) for i in range(0, n, size)]

    def one(batch):
        limit = torch.full((batch.size(0),), 24)
        if search == "greedy":
            return decoding.greedy(model, batch, limit, ignore_eos=True)
        return decoding.beam_search(model, batch, limit, beam=5, ignore_eos=True)
    started = time.perf_counter()
    for _ in decoding.parallel_map(one, batches, decoding.decode_workers(0, torch.device("cpu"), len(batches))):
        pass
    return round(n / (time.perf_counter() - started), 1)


def main() -> None:
    torch.manual_seed(0)
    model = inference.for_decoding(Transformer(ModelConfig(**SHAPE)).eval(), "none")
    srcs = sources()
    speed(model, srcs, 1, 8, "greedy"), speed(model, srcs, 128, 128, "greedy")  # warm-up
    print(json.dumps({"b1 greedy": speed(model, srcs, 1, 100, "greedy"), "b1 beam5": speed(model, srcs, 1, 60, "beam5"),
                      "b128 greedy": speed(model, srcs, 128, 512, "greedy"),
                      "b128 beam5": speed(model, srcs, 128, 256, "beam5")}), flush=True)


if __name__ == "__main__":
    main()
