"""``copy``: reproduce a random symbol sequence -- the classic first experiment for a Transformer.

No data files: sequences are drawn from a seeded generator, so every run sees the same splits.
Input and output are space-separated symbols, e.g. ``1 4 7 2 9 3 5 8 2 6``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from taskformer import Task, TaskData, hookimpl, option, symbols


@dataclass
class Options:
    """The ``data`` options; ``vocab`` counts padding like the classic setup: symbols are 1 .. vocab-1."""

    vocab: int = option(11, "Symbols, counting padding: the sequences use 1 .. vocab-1.", at_least=3)
    length: int = option(10, "Symbols per sequence.", at_least=1)
    train_size: int = option(20000, "Training sequences.", at_least=1)
    val_size: int = option(500, "Validation sequences.", at_least=1)
    test_size: int = option(1000, "Test sequences.", at_least=1)

    def footprint(self) -> dict[str, int]:
        """The size of the data these options make, checked against free memory before it is made."""
        examples = self.train_size + self.val_size + self.test_size
        return {"vocab_size": self.vocab, "tokens": 2 * self.length * examples}  # source and target


TASK = Task(
    name="copy",
    description="Copy a random symbol sequence (synthetic, needs no data)",
    variant="encoder-decoder",
    metric="exact_match",
    examples=("1 4 7 2 9 3 5 8 2 6", "10 9 8 7 6 5 4 3 2 1", "5 5 1 3 8 8 2 6 9 4"),  # as long as what it learns
    defaults={
        # Sized to reach 100% in well under a minute on any 2-core CPU (AVX2 included, in fp32): a
        # narrow model, and a linear decay that lets the 400 updates settle (the 1/sqrt(step) decay
        # left the rate high enough for val exact match to swing; docs/results.md).
        "model": {"d_model": 64, "n_heads": 4, "enc_layers": 2, "dec_layers": 2, "d_ff": 256,
                  "dropout": 0.0, "max_len": 64},
        "train": {"epochs": 2, "max_tokens": 1200, "lr": 1e-3, "warmup": 100, "schedule": "linear",
                  "label_smoothing": 0.0},
        "decode": {"strategy": "greedy", "max_len_a": 1.0, "max_len_b": 2},
    },
    data_options=Options,
)


@hookimpl
def taskformer_tasks():
    return [TASK]


@hookimpl
def taskformer_data(config):
    opts = config.data
    names = [str(i) for i in range(1, opts.vocab)]
    rng = random.Random(config.train.seed)

    def split(n: int) -> list[tuple[str, str]]:
        seqs = (" ".join(rng.choice(names) for _ in range(opts.length)) for _ in range(n))
        return [(s, s) for s in seqs]

    return TaskData(tokenizer=symbols(names),
                    splits={"train": split(opts.train_size), "val": split(opts.val_size),
                            "test": split(opts.test_size)})


@hookimpl
def taskformer_metrics(hypotheses, references):
    exact = sum(h == r for h, r in zip(hypotheses, references))
    pairs = [(h.split(), r.split()) for h, r in zip(hypotheses, references)]
    right = sum(sum(a == b for a, b in zip(h, r)) for h, r in pairs)
    total = sum(max(len(h), len(r)) for h, r in pairs)
    return {"exact_match": 100.0 * exact / len(references), "token_accuracy": 100.0 * right / max(total, 1)}
