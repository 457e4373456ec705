"""Built-in defaults, provided through the same hooks as any plugin.

They run last (``trylast``), so a task's own implementation always wins; a task that is happy
with the standard head and search implements neither hook.
"""
from __future__ import annotations

from ..core import decoding
from ..core.config import decode_config
from .hookspecs import hookimpl


@hookimpl(trylast=True)
def taskformer_decode(model, src, tokenizer, labels, config):
    """Arg-max label for classifiers; beam or greedy search for sequence models."""
    if model.cfg.variant == "encoder-only":
        prob, index = decoding.classify(model, src).max(-1)
        return [f"{labels[i]}\t{p:.4f}" for p, i in zip(prob.tolist(), index.tolist())]
    dc = decode_config(config)
    limit = decoding.max_lengths(src, dc.max_len_a, dc.max_len_b, model.cfg.max_len)
    if dc.strategy == "beam" and dc.beam > 1:
        ids = decoding.beam_search(model, src, limit, beam=dc.beam, length_penalty=dc.length_penalty)
    else:
        ids = decoding.greedy(model, src, limit)
    return [tokenizer.decode(x) for x in ids]
