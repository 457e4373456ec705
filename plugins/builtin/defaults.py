"""The defaults every task gets through the same hooks as any plugin: a decoder, tagging metrics and
a language model's metrics.

The decoder runs last (``trylast``), so a task's own implementation always wins; a task that is happy
with the standard search implements no decode hook at all. The metrics are merged with the task's.
"""
from __future__ import annotations

from taskformer import hookimpl, span_scores
from taskformer.core import variants
from taskformer.core.metrics import is_bio, language_model_scores


@hookimpl(trylast=True)
def taskformer_decode(model, src, tokenizer, labels, words, config):
    """The arg-max Label for classifiers, the arg-max tag of each word for taggers, and beam or greedy
    search, as ``config.decode`` says, for sequences."""
    from taskformer import best_labels, best_tags, search  # torch: loaded by the first decode, not by listing tasks

    kind = model.cfg.kind
    if kind.decoder:
        return [tokenizer.decode(ids) for ids in search(model, src, config.decode)]
    return best_tags(model, src, words, labels) if kind.per_word else best_labels(model, src, labels)


@hookimpl
def taskformer_metrics(task, hypotheses, references, logprobs):
    """For decoder-only tasks: ``perplexity``, ``bits_per_token`` and ``bits_per_char`` of the
    references (see :func:`taskformer.core.metrics.language_model_scores`). For tagging tasks:
    ``token_accuracy``, the percentage of words tagged right, and ``exact_match``, the percentage of
    inputs with every word right; for BIO, IOB or IOBES tags also the entity-level ``span_precision``,
    ``span_recall``, ``span_f1`` and ``span_f1_TYPE`` (see :func:`taskformer.span_scores`)."""
    kind = variants.of(task.variant)
    if not kind.encoder:
        return language_model_scores(references, logprobs)
    if not kind.per_word:
        return None
    pairs = [(h.split(), r.split()) for h, r in zip(hypotheses, references)]
    right = sum(a == b for h, r in pairs for a, b in zip(h, r))
    words = sum(len(r) for _, r in pairs)
    scores = {"token_accuracy": 100.0 * right / max(words, 1),
              "exact_match": 100.0 * sum(h == r for h, r in pairs) / max(len(pairs), 1)}
    if is_bio(references):  # entity tags (B-PER I-PER O ...): entity-level scores as well
        scores.update(span_scores(hypotheses, references))
    return scores
