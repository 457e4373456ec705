"""Scoring given targets under a model: teacher forcing, no search.

Validation's loss, a metric's per-token log-probabilities and a distillation's teacher outputs all
read the references' log-probabilities from here, in the precision training and decoding use.
"""
from __future__ import annotations

from itertools import islice

import torch

from taskformer.core import precision
from taskformer.core.data import IGNORE, Encoded, collate, token_batches
from taskformer.core.loss import teacher_forced
from taskformer.core.model import PAD, SequenceModel
from taskformer.core.train_config import TrainConfig


@torch.no_grad()
def reference_logprobs(model: SequenceModel, data: Encoded, rows: int, cfg: TrainConfig,
                       device: torch.device) -> list[list[float]]:
    """The model's log-probability (nats) of every scored target of ``data``, one list per row of the
    split: a sequence's tokens, a class, a tagger's tagged words, a language model's text (whose
    blocks' targets ``data.owners`` gives back to rows, a run of targets each). No smoothing, no
    dropout: ``-mean`` of them all is the validation loss, and their sums per row give perplexity or
    a label's likelihood."""
    model.eval()
    shifted = teacher_forced(model)
    per_sequence: list[list[float]] = [[] for _ in range(len(data))]
    for index in token_batches(data.lengths(), cfg.max_tokens):
        src, tgt = (t.to(device) for t in collate(data, index))
        with precision.autocast(cfg.bf16, device):
            logits = model(src, tgt[:, :-1]) if shifted else model(src)
        gold, skip = (tgt[:, 1:], PAD) if shifted else (tgt, IGNORE)
        logits = logits.float()
        picked = logits.gather(-1, gold.clamp(min=0).unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
        keep = gold != skip
        for row, i in enumerate(index):
            per_sequence[i] = picked[row].reshape(-1)[keep[row].reshape(-1)].tolist()
    if data.owners is None:
        return per_sequence
    out: list[list[float]] = [[] for _ in range(rows)]
    scores = (score for sequence in per_sequence for score in sequence)  # every target, in block order
    for row, count in data.owners.tolist():
        out[row].extend(islice(scores, count))
    return out
