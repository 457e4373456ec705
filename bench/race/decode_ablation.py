"""What each change that brought decoding up to CTranslate2's speed bought: bench/race/speed.py's ``decode_ablation``.

The current code decodes side by side, in the same rounds, with the same code with one change
undone (``ABLATIONS``): through the searches' ``drop_finished`` where the core has a setting for it,
otherwise by monkeypatching from here.
"""
from __future__ import annotations

import contextlib
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py

from machine import alternate, timed  # noqa: E402
from taskformer.core import decoding, inference  # noqa: E402
from taskformer.core.data import pad  # noqa: E402
from workload import L, Transformer, decode_fixed, make_taskformer  # noqa: E402


@contextmanager
def patched(obj, name: str, value):
    """``obj.name = value`` for the duration (the ablation's way to undo one change, outside the core's API)."""
    kept = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, kept)


def memory_per_hypothesis():
    """Beam search as before: every hypothesis with its own copy of the encoder memory and cross keys/values."""
    shared = decoding.Memory.of

    def of(cls, model, src, rows_per_sentence=1):
        m = shared(model, src, rows_per_sentence)
        rows = torch.arange(src.size(0)).repeat_interleave(rows_per_sentence)
        return cls(m.states[rows], m.mask, None if m.cross_mask is None else m.cross_mask[rows])
    return patched(decoding.Memory, "of", classmethod(of))


def no_inference_mode():
    """The searches under ``torch.no_grad`` instead of ``torch.inference_mode``."""
    stack = ExitStack()
    for f in ("greedy", "beam_search"):
        stack.enter_context(patched(decoding, f, torch.no_grad()(getattr(decoding, f).__wrapped__)))
    return stack


def unpacked():
    """Decoding with the trained model's own ``nn.Linear`` layers instead of its packed copy."""
    return contextlib.nullcontext("unpacked")


# Each of those changes, undone alone (with every other change kept); only where it acts:
# the shared cross-attention memory in beam search, dropping ended rows where sentences have budgets of
# their own (as in real decoding: a * source length + b), the rest everywhere.
ABLATIONS = {
    "linear layers pre-packed for oneDNN": (("greedy", "beam5"), False, unpacked),
    "beam hypotheses share the cross-attention memory": (("beam5",), False, memory_per_hypothesis),
    "ended rows leave the batch": (("greedy", "beam5"), True, lambda: contextlib.nullcontext("rows kept")),
    "inference_mode (not no_grad)": (("greedy", "beam5"), False, no_inference_mode),
    "key/value cache sized once": (("greedy", "beam5"), False, lambda: patched(
        Transformer, "new_cache", lambda self, steps=0, _new=Transformer.new_cache: _new(self))),
}


def ablation(val_src, n: int, rounds: int, workers: int) -> dict:
    """``{change: {workload: speed with the change / speed without it}}``, fp32, batches of 128, taskformer alone.

    Side by side in the same rounds: the current code, and the current code with one change undone
    by monkeypatching from here (``ABLATIONS``). Above 1: the change made decoding faster.
    """
    model = make_taskformer(False)[0].eval()
    fast = inference.for_decoding(model, "none")
    order = sorted(range(n), key=lambda i: -len(val_src[i]))
    batches = [pad([val_src[j] for j in order[i : i + 128]]) for i in range(0, n, 128)]

    def work(search, budgets, undo):
        def run(_):
            with undo() as undone:
                m, drop = (model if undone == "unpacked" else fast), undone != "rows kept"
                for _ in decoding.parallel_map(lambda b: decode_fixed(m, b, search, budgets=decoding.max_lengths(
                        b, 1.2, 10, 128) if budgets else None, drop_finished=drop), batches, workers):
                    pass
            return n
        return run

    contenders: dict = {}
    for change, (searches, budgets, undo) in ABLATIONS.items():
        for search in searches:
            workload = f"{search}, {'own budgets' if budgets else f'{L} steps'}"
            contenders.setdefault((workload, "now"), work(search, budgets, contextlib.nullcontext))
            contenders[(workload, change)] = work(search, budgets, undo)
    secs = alternate(contenders, lambda name, fn: timed(fn, None), rounds)
    out: dict = {}
    for (workload, change), s in secs.items():
        if change != "now":
            out.setdefault(change, {})[workload] = s / secs[(workload, "now")]
    return out
