"""``translate``: a user's own parallel text, any language pair, with no code.

``taskformer run translate --data DIR`` reads line-aligned files (``train.fr`` + ``train.en``: the
languages from the suffixes), a table with ``src``/``tgt`` or ``source``/``target`` or language-named
columns, or HF's translation layout, through :mod:`taskformer.core.userdata`. With two language
columns and no choice the other language is translated into English; ``--set data.source=en``
(or ``data.target=``) chooses the direction. The model and recipe are translate-de-en's (that task
is this one on Multi30k: it takes its defaults, recipes and options from here). Scores: sacreBLEU
with the tokenizer the target language needs (``zh``, ``ja-mecab`` where MeCab is installed, else
``13a``), chrF, and lower-cased BLEU.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any

from taskformer import DataError, Task, TaskData, hookimpl, option, subword, translation_metrics
from taskformer.core import userdata

SOURCE = ("src", "source", "input")
TARGET = ("tgt", "target", "output")


@dataclass
class PairOptions:
    """The vocabulary of a translation task and a cap on its train pairs (translate-de-en's)."""

    vocab_size: int = option(10000, "Size of the joint source+target vocabulary.", at_least=100)
    tokenizer: str = option("bpe", "Subword tokenizer kind.", choices=("bpe", "unigram", "wordpiece"))
    max_train: int = option(0, "Train pairs used; 0: all.", at_least=0)


@dataclass
class Options(userdata.ReadOptions, PairOptions):
    """The ``data`` options: the direction (columns or languages), the vocabulary, how splits are made."""

    source: str = option("", "Source column or language (en); empty: src/source, or of two language columns "
                             "the one that is not English.")
    target: str = option("", "Target column or language (de); empty: tgt/target, or the other language column.")


# The small recipe of Wu et al. (2021) for Multi30k's 29k pairs, with what an hour on a 2-core CPU
# changes chosen on val (docs/results.md): d128, 4+4 layers, FFN 256, 4 heads, a joint vocabulary of
# 10k, lr 5e-3, the last 10 evaluated weights averaged; dropout 0.1 and 1,000 warm-up steps instead of
# 0.3 and 2,000, since an hour is about 2,500 updates, not 8,000. Length penalty 1.4: chosen on val.
DEFAULTS = {
    "model": {"d_model": 128, "n_heads": 4, "enc_layers": 4, "dec_layers": 4, "d_ff": 256,
              "dropout": 0.1, "max_len": 128, "tie_embeddings": True},
    "train": {"epochs": 40, "max_tokens": 4096, "lr": 5e-3, "warmup": 1000, "label_smoothing": 0.1,
              "average_last": 10},
    "decode": {"strategy": "beam", "beam": 5, "length_penalty": 1.4, "eval_strategy": "greedy"},
}
# What a --time-limit budget buys, in target tokens. Below about half of the one-hour 2-core AVX2
# recipe's budget (11-12 M target tokens, docs/results.md) the run ends its schedule instead: the rate
# falls to zero over the last 30%, no averaging, and its batches are half as large: at the same target
# tokens, twice the updates learn much more in the first few hundred (chosen on val at a fixed count
# of updates against 1,024 and 4,096 tokens, another peak rate and a constant rate before the decay,
# docs/results.md), at about the same tokens per second. A validation every 400 updates (every 200 of
# the default batches: about a minute of a 2-core CPU) also re-times the final evaluation, which the
# time kept back for it needs after a busy start. Above it, members, not a wider model: Multi30k
# over-fits a single model given more (Wu et al., 2021), while each member of an ensemble gets about
# the one-hour recipe's budget.
RECIPES: tuple[tuple[float, dict[str, dict[str, Any]], str], ...] = (
    (0, {"train": {"cooldown": 0.3, "average_last": 0, "eval_every": 400, "max_tokens": 2048}},
     "a short budget: batches of half the tokens, decay to zero over the last 30%, a validation every 400 updates"),
    (6e6, {}, "one model: the budget of the validated one-hour recipe or less"),
    (20e6, {"model": {"members": 2}}, "each member gets about the one-hour recipe's budget"),
    (30e6, {"model": {"members": 3}}, "each member gets about the one-hour recipe's budget"),
)

TASK = Task(name="translate", description="Your own parallel text, any language pair (encoder-decoder, sacreBLEU)",
            variant="encoder-decoder", metric="bleu", higher_is_better=True, defaults=DEFAULTS,
            data_options=Options, recipes=RECIPES)


@hookimpl
def taskformer_tasks():
    return [TASK]


def direction(source: userdata.Source, opts: Options) -> tuple[str, str]:
    """The source and target columns: chosen, named src/tgt, or two language columns (into English)."""
    languages = [c for c in source.columns if userdata.LANGUAGE.fullmatch(c) and c not in SOURCE + TARGET]
    named = {role: given or next((c for c in common if c in source.columns), "")
             for role, given, common in (("source", opts.source, SOURCE), ("target", opts.target, TARGET))}
    if not named["source"] and not named["target"] and len(languages) == 2 and "en" in languages:
        named["target"] = "en"
    if len(languages) == 2:
        for role, other in (("source", "target"), ("target", "source")):
            if not named[role] and named[other] in languages:
                named[role] = next(c for c in languages if c != named[other])
    if not named["source"] or not named["target"]:
        raise DataError(f"{source.location}: which columns are source and target? columns found: "
                        f"{', '.join(source.columns)}; choose with --set data.source=NAME --set data.target=NAME")
    src = source.pick("source", named["source"], SOURCE)[0]
    tgt = source.pick("target", named["target"], TARGET)[0]
    if src == tgt:
        raise DataError(f"data.source and data.target are the same column {src!r}")
    return src, tgt


def bleu_tokenizer(language: str) -> tuple[str, str]:
    """sacreBLEU's tokenizer for a target language, and a note where the right one is missing."""
    if language.startswith("zh"):
        return "zh", ""
    if language.startswith("ja"):
        if find_spec("MeCab"):
            return "ja-mecab", ""
        return "13a", "13a: ja-mecab needs MeCab (pip install 'sacrebleu[ja]'), so Japanese BLEU here splits on spaces"
    return "13a", ""


@hookimpl
def taskformer_data(task, config, data_dir, tokenizer):
    opts = config.data
    source = userdata.read(userdata.location(data_dir, task.name), opts)
    src, tgt = direction(source, opts)
    language = tgt if userdata.LANGUAGE.fullmatch(tgt) and tgt not in TARGET else ""
    bleu, warning = bleu_tokenizer(language)
    fields = {"bleu_tokenize": bleu}  # the metrics hook scores with it
    pairs: dict[str, Any] = {}
    for split in ("val", "test"):
        rows, _ = source.rows(split, [src, tgt])
        pairs[split] = [(s, t, fields) for s, t in rows]
    train = source.dataset("train", [src, tgt], ["source", "target"])  # read a chunk at a time, never held
    if 0 < opts.max_train < len(train):  # a seeded subsample, for quick runs (the same on resume)
        train = train.select(sorted(random.Random(config.train.seed).sample(range(len(train)), opts.max_train)))
    pairs["train"] = train
    if tokenizer is None:  # one vocabulary of both sides of train: source, target and output share embeddings
        sides = (text for batch in userdata.batches(train) for pair in zip(batch["source"], batch["target"])
                 for text in pair)
        tokenizer = subword(sides, opts.vocab_size, kind=opts.tokenizer)
    source.notes["direction"] = f"{src} -> {tgt} (data.source, data.target choose)"
    source.notes["BLEU tokenizer"] = warning or bleu
    userdata.tell(source)
    return TaskData(tokenizer=tokenizer, splits=pairs, notes=source.notes)


def scores(hypotheses, references, tokenize: str = "13a") -> dict[str, float]:
    """Corpus sacreBLEU on detokenized text with sacreBLEU's ``tokenize``, chrF, and lower-cased BLEU as
    many tutorials report."""
    import sacrebleu  # here: listing the installed tasks imports this module

    return {**translation_metrics(hypotheses, references, tokenize=tokenize),
            "bleu_lowercase": sacrebleu.corpus_bleu(hypotheses, [references], lowercase=True, tokenize=tokenize).score}


@hookimpl
def taskformer_metrics(hypotheses, references, fields):
    """:func:`scores` with the target language's BLEU tokenizer, which the data hook put in the fields."""
    return scores(hypotheses, references, next((f["bleu_tokenize"] for f in fields if f and "bleu_tokenize" in f),
                                               "13a"))
