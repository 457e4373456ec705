"""The default decoder, provided through the same hook as any plugin.

It runs last (``trylast``), so a task's own implementation always wins; a task that is happy with
the standard search implements no decode hook at all.
"""
from __future__ import annotations

from taskformer import best_labels, hookimpl, search


@hookimpl(trylast=True)
def taskformer_decode(model, src, tokenizer, labels, config):
    """The arg-max Label for classifiers; beam or greedy search, as ``config.decode`` says, for sequences."""
    if model.cfg.variant == "encoder-only":
        return best_labels(model, src, labels)
    return [tokenizer.decode(ids) for ids in search(model, src, config.decode)]
