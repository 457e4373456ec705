"""``classify`` and ``classify-pair``: a user's own texts and labels, with no code.

``taskformer run classify --data tickets.csv --set data.text=title,body --set data.label=topic``
reads the file (or folder, or ``hub:NAME``) through :mod:`taskformer.core.userdata`, joins the text
columns with a space, and trains the encoder-only classifier with agnews's recipe (``agnews`` is this
task on AG News: it takes its defaults, recipes, tokenizer and scores from here). ``classify-pair``
reads two text columns (premise and hypothesis, question and answer) as one input. Scores: accuracy
and macro-F1 over the labels.
"""
from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tokenizers import normalizers

from taskformer import DataError, Task, TaskData, hookimpl, option, subword
from taskformer.core import userdata
from taskformer.core.data import each_row
from taskformer.core.userlines import Columns

TEXT = ("text", "sentence", "content", "review", "document")
FIRST = ("sentence1", "premise", "question", "text1", "text_a")
SECOND = ("sentence2", "hypothesis", "answer", "text2", "text_b")
LABEL = ("label", "labels", "class", "category")


@dataclass
class TextOptions:
    """The tokenizer and augmentation options of a classifier (agnews's, the defaults validated there)."""

    tokenizer: str = option("wordpiece", "Subword tokenizer kind.", choices=("wordpiece", "bpe"))
    vocab_size: int = option(8000, "Tokenizer vocabulary size.", at_least=100)
    lowercase: bool = option(True, "Lower-case the text before tokenizing.")
    augment: int = option(1, "Extra copies of train with words dropped at rate word_drop.", at_least=0)
    word_drop: float = option(0.1, "Rate at which each word of an augmented copy is dropped.", at_least=0.0, below=1.0)


@dataclass
class Options(userdata.ReadOptions, TextOptions):
    """The ``data`` options: which columns are text and label, the label names, how splits are made."""

    text: str = option("", "Text column(s), comma-separated, joined with a space (classify-pair: the first "
                           "text); empty: the one of text, sentence, content, review, document present.")
    text_pair: str = option("", "classify-pair's second text column; empty: the one of sentence2, hypothesis, "
                                "answer, text2, text_b present.")
    label: str = option("", "Label column; empty: the one of label, labels, class, category present.")
    label_names: str = option("", "Names of numeric labels, comma-separated, in the order of the numbers "
                                  "(1,2,3,4 -> World,Sports,Business,Sci/Tech); empty: the numbers are the names.")


# Sized for AG News's 5,000-row subset and its 120,000 rows alike (docs/results.md): one narrow layer
# over mean-pooled states; dropout, word-drop copies and early stopping hold back over-fitting. Twenty
# members averaged (model.members): the errors of differently initialised networks are partly
# independent. Chosen on held-out train rows, never the test set.
DEFAULTS = {
    "model": {"d_model": 128, "n_heads": 4, "enc_layers": 1, "d_ff": 256, "dropout": 0.3, "max_len": 128,
              "pooling": "mean", "members": 20},
    # max_len 128 cuts 0.2% of AG News's train and 0.4% of its test inputs (median 50 tokens)
    "train": {"epochs": 20, "max_tokens": 4096, "lr": 1e-3, "warmup": 200, "label_smoothing": 0.1,
              "weight_decay": 0.01, "patience": 3},
}
# Budgets in examples the twenty-member default trains on (the table's unit is the task's own model).
# The ensemble needs about three epochs of AG News's augmented 9,500 rows (88.2% in 5 minutes on a
# 2-core EPYC, docs/results.md); a smaller budget buys those epochs for fewer members.
RECIPES: tuple[tuple[float, dict[str, dict[str, Any]], str], ...] = (
    (0, {"model": {"members": 1}}, "one network: too small a budget for three epochs of several members"),
    (4e3, {"model": {"members": 3}}, "three members get about three epochs each"),
    (7e3, {"model": {"members": 5}}, "five members get about three epochs each"),
    (28e3, {}, "the twenty-member default gets about three epochs"),
)

TASK = Task(name="classify", description="Your own texts and labels (a file, folder or hub:NAME; encoder-only)",
            variant="encoder-only", metric="accuracy", higher_is_better=True, defaults=DEFAULTS,
            data_options=Options, recipes=RECIPES)
PAIR = Task(name="classify-pair", description="Your own pairs of texts and their labels (encoder-only)",
            variant="encoder-only", metric="accuracy", higher_is_better=True, defaults=DEFAULTS,
            data_options=Options, recipes=RECIPES, pairs=True)


@hookimpl
def taskformer_tasks():
    return [TASK, PAIR]


def text_tokenizer(texts, opts: TextOptions):
    """The subword tokenizer of train's texts; lower-casing, where chosen, is in the saved tokenizer,
    so predict lower-cases its input too."""
    tokenizer = subword((s.lower() if opts.lowercase else s for s in texts), opts.vocab_size, kind=opts.tokenizer)
    if opts.lowercase:
        tokenizer.normalizer = normalizers.Sequence([tokenizer.normalizer, normalizers.Lowercase()])
    return tokenizer


def noisy_copies(rows, copies: int, drop: float, seed: int) -> Iterator[tuple[str, str]]:
    """``copies`` extra versions of every row (a list or a ``datasets.Dataset``) with each word
    dropped at rate ``drop`` (augmentation), one at a time."""
    rng = random.Random(seed + 1)
    for _ in range(copies):
        for text, label, *_ in each_row(rows):
            words = text.split()
            kept = [w for w in words if rng.random() >= drop] or words[:1]
            yield " ".join(kept), label


@hookimpl
def taskformer_data(task, config, data_dir, tokenizer):
    opts = config.data
    source = userdata.read(userdata.location(data_dir, task.name), opts)
    texts = ([source.pick("text", opts.text, FIRST)[0], source.pick("text_pair", opts.text_pair, SECOND)[0]]
             if task.pairs else source.pick("text", opts.text, TEXT, several=True))
    label = source.pick("label", opts.label, LABEL)[0]
    names = userdata.LabelNames(source, label, opts.label_names)

    def labelled(split: str):  # the split's (input, label name) rows, a batch of the table at a time
        batches = (([(tuple(map(str, r[:2])) if task.pairs else " ".join(map(str, r[:-1])), r[-1]) for r in rows], where)
                   for rows, where in source.each_batch(split, [*texts, label]))
        return names.keep(split, batches)

    splits: dict[str, Any] = {split: list(labelled(split)) for split in ("val", "test")}
    train = table_of(labelled("train"), task.pairs)  # Arrow, never held as Python rows
    if not len(train):
        raise DataError(f"{source.location}: no train row has both a text and a label")
    if tokenizer is None:
        tokenizer = text_tokenizer((t for s, _ in each_row(train) for t in (s if task.pairs else [s])), opts)
    splits["train"] = train
    if opts.augment and not task.pairs:
        extra = table_of(noisy_copies(train, opts.augment, opts.word_drop, config.train.seed), False)
        source.notes["augmented train rows"] = f"{len(extra):,} (word drop {opts.word_drop:g})"
        splits["train"] = userdata.quiet_datasets().concatenate_datasets([train, extra])
    userdata.tell(source)
    return TaskData(tokenizer=tokenizer, splits=splits, labels=names.names, notes=source.notes)


def table_of(rows: Iterable[tuple], pairs: bool) -> Any:
    """``(input, label)`` rows as a ``datasets.Dataset`` of ``source`` and ``target``, gathered a
    batch at a time (:class:`~taskformer.core.userlines.Columns`)."""
    table = Columns(["source", "target"], lists=("source",) if pairs else ())
    for row in rows:
        table.add(*row)
    return table.dataset()


def scores(hypotheses, references) -> dict[str, float]:
    """Accuracy and macro-F1 (the mean of each label's F1) in percent."""
    pred = [h.label for h in hypotheses]
    pairs = list(zip(pred, references))
    f1s = []
    for c in sorted(set(pred) | set(references)):
        tp = sum(p == c and r == c for p, r in pairs)
        both = sum(p == c for p in pred) + sum(r == c for r in references)
        f1s.append(2 * tp / both)
    return {"accuracy": 100.0 * sum(p == r for p, r in pairs) / max(len(pairs), 1),
            "macro_f1": 100.0 * sum(f1s) / max(len(f1s), 1)}


@hookimpl
def taskformer_metrics(hypotheses, references):
    return scores(hypotheses, references)
