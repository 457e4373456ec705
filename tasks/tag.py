"""``tag``: one tag per word of a user's own sentences (named entities, parts of speech), with no code.

``taskformer run tag --data FILE.conll`` reads CoNLL files (a word per line, its tag in the last
column, a blank line between sentences) or a table with ``tokens`` and ``tags`` columns (lists, or
space-separated text; a hub data set's ``ner_tags`` with their names), through
:mod:`taskformer.core.userdata`. The encoder tags each word at its first subword token. The core
scores token accuracy and, for BIO/IOBES tags, entity spans; ``score``, which picks the best
checkpoint, is span F1 where the tags are BIO and token accuracy otherwise.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from taskformer import DataError, Task, TaskData, hookimpl, option, span_scores, subword
from taskformer.core import userdata
from taskformer.core.metrics import is_bio
from taskformer.core.userlines import Columns

WORDS = ("tokens", "words")
TAGS = ("tags", "ner_tags", "labels", "tag", "ner")


@dataclass
class Options(userdata.ReadOptions):
    """The ``data`` options: the word and tag columns, the tokenizer, how splits are made."""

    tokens: str = option("", "Words column (a list, or text split at spaces); empty: tokens or words.")
    tags: str = option("", "Tags column, one per word; empty: the one of tags, ner_tags, labels, tag, ner present.")
    vocab_size: int = option(8000, "Subword vocabulary of the words (a rare word is split into pieces).",
                             at_least=100)


TASK = Task(
    name="tag", description="Your own words and tags, one tag per word (CoNLL or a table; encoder-only)",
    variant="tagging", metric="score", higher_is_better=True,
    metric_groups={"tags": ["score", "span_f1", "span_precision", "span_recall", "token_accuracy", "exact_match"]},
    # A small encoder of classify's width with a second layer: a word's tag depends on its neighbours.
    defaults={"model": {"d_model": 128, "n_heads": 4, "enc_layers": 2, "d_ff": 256, "dropout": 0.1, "max_len": 128},
              "train": {"epochs": 20, "max_tokens": 4096, "lr": 1e-3, "warmup": 200, "label_smoothing": 0.0,
                        "weight_decay": 0.01, "patience": 3}},
    data_options=Options,
    # Budgets in target tags: a larger budget buys a deeper encoder and then members (as classify's).
    recipes=((0, {}, "two layers of width 128"),
             (20e6, {"model": {"enc_layers": 4}}, "four layers: enough budget for a deeper encoder"),
             (60e6, {"model": {"enc_layers": 4, "members": 3}}, "three members of four layers")),
)


@hookimpl
def taskformer_tasks():
    return [TASK]


def names_of(source: userdata.Source, column: str):
    """A function from a row's tags (a list, or space-separated text; ids where the hub names them) to tag names."""
    feature = source.feature(column)
    classes = getattr(getattr(feature, "feature", None), "names", None)

    def tags(value) -> list[str]:
        items = value.split() if isinstance(value, str) else list(value)
        return [classes[t] if classes and isinstance(t, int) else str(t) for t in items]
    return tags


@hookimpl
def taskformer_data(task, config, data_dir, tokenizer):
    opts = config.data
    source = userdata.read(userdata.location(data_dir, task.name), opts)
    words, tags = source.pick("tokens", opts.tokens, WORDS)[0], source.pick("tags", opts.tags, TAGS)[0]
    named = names_of(source, tags)
    splits: dict[str, Any] = {}
    counts: Counter = Counter()  # of train's tags
    for split in userdata.SPLITS:
        train = Columns(["source", "target"]) if split == "train" else None  # Arrow: train streams by
        kept = []
        uneven, unseen = userdata.Tally("words and tags differ in count"), userdata.Tally("a tag train never has")
        for rows, where in source.each_batch(split, [words, tags]):
            for i, (ws, ts) in enumerate(rows):
                ws, ts = (ws.split() if isinstance(ws, str) else [str(w) for w in ws]), named(ts)
                if len(ws) != len(ts):
                    uneven.add(where, i, f"{len(ws)} words, {len(ts)} tags")
                elif train is not None:
                    train.add(" ".join(ws), " ".join(ts))
                    counts.update(ts)
                elif not set(ts) <= counts.keys():
                    unseen.add(where, i, ", ".join(sorted(set(ts) - counts.keys())))
                else:
                    kept.append((" ".join(ws), " ".join(ts)))
        uneven.tell(source, split)
        unseen.tell(source, split)
        splits[split] = train.dataset() if train is not None else kept
    if not len(splits["train"]):
        raise DataError(f"{source.location}: no train sentence has as many tags as words")
    if tokenizer is None:
        tokenizer = subword((s for batch in userdata.batches(splits["train"]) for s in batch["source"]), opts.vocab_size)
    userdata.tell(source)
    # the most common tag first: a word beyond model.max_len gets it
    return TaskData(tokenizer=tokenizer, splits=splits, labels=[t for t, _ in counts.most_common()],
                    notes=source.notes)


@hookimpl
def taskformer_metrics(hypotheses, references):
    """``score``: span F1 for BIO/IOBES tags (entities), else the share of words tagged right."""
    if is_bio(references):
        return {"score": span_scores(hypotheses, references)["span_f1"]}
    pairs = [(a, b) for h, r in zip(hypotheses, references) for a, b in zip(h.split(), r.split())]
    return {"score": 100.0 * sum(a == b for a, b in pairs) / max(sum(len(r.split()) for r in references), 1)}
