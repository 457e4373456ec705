"""``translate-de-en``: German to English on Multi30k (task 1, Flickr30k captions), scored with sacreBLEU.

Data: ``train``, ``val`` and ``test_2016_flickr`` as line-aligned ``.de``/``.en`` files (plain or
gzip) under ``--data-dir``, the layout of the original release; without ``--data-dir`` the Hugging
Face hub copy ``bentrevett/multi30k`` is downloaded. One BPE vocabulary is trained on both sides of
the train split, so source, target and output layer share one embedding matrix: German and English
captions share many names, numbers and word pieces, and tying saves a third of a small model's parameters.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from taskformer import (
    DataError,
    Task,
    TaskData,
    cross_attention,
    find_file,
    hookimpl,
    option,
    read_parallel,
    subword,
    translation_metrics,
)

FILES = {"train": "train", "val": "val", "test": "test_2016_flickr"}  # split -> file stem of the release
HUB = "bentrevett/multi30k"
HUB_SPLITS = {"train": "train", "val": "validation", "test": "test"}

@dataclass
class Options:
    """The ``data`` options: the size of the joint de+en vocabulary and its kind, and how many train
    pairs to use (0: all)."""

    vocab_size: int = option(10000, "Size of the joint source+target vocabulary.", at_least=100)
    tokenizer: str = option("bpe", "Subword tokenizer kind.", choices=("bpe", "unigram", "wordpiece"))
    max_train: int = option(0, "Train pairs used; 0: all.", at_least=0)


TASK = Task(
    name="translate-de-en",
    description="German to English translation on Multi30k, scored with sacreBLEU",
    variant="encoder-decoder",
    metric="bleu",
    examples=("Ein Hund rennt über die Wiese.", "Zwei Kinder spielen am Strand im Sand.",
              "Eine Frau mit einem roten Hut fährt Fahrrad."),
    languages=("de", "en"),
    higher_is_better=True,
    defaults={
        # The small recipe of Wu et al. (2021) for these 29k pairs, with what an hour on a 2-core CPU
        # changes chosen on val (docs/results.md): d128, 4+4 layers, FFN 256, 4 heads, a joint vocabulary
        # of 10k, lr 5e-3, the last 10 evaluated weights averaged; dropout 0.1 and 1,000 warm-up steps
        # instead of 0.3 and 2,000, since an hour is about 2,500 updates, not 8,000. Length penalty 1.4:
        # chosen on val (docs/results.md).
        "model": {"d_model": 128, "n_heads": 4, "enc_layers": 4, "dec_layers": 4, "d_ff": 256,
                  "dropout": 0.1, "max_len": 128, "tie_embeddings": True},
        "train": {"epochs": 40, "max_tokens": 4096, "lr": 5e-3, "warmup": 1000, "label_smoothing": 0.1,
                  "average_last": 10},
        "decode": {"strategy": "beam", "beam": 5, "length_penalty": 1.4, "eval_strategy": "greedy"},
    },
    data_options=Options,
    # What a --time-limit budget buys, in target tokens. Below about half of the one-hour 2-core AVX2
    # recipe's budget (11-12 M target tokens, docs/results.md) the run ends its schedule instead:
    # the rate falls to zero over the last 30% (averaging the last checkpoints does the same work
    # slower), and fewer validations leave more updates. Above it, members, not a wider model:
    # Multi30k over-fits a single model given more (Wu et al., 2021), while each member of an ensemble
    # gets about the one-hour recipe's budget.
    recipes=(
        (0, {"train": {"cooldown": 0.3, "average_last": 0, "eval_every": 200}},
         "a short budget: decay to zero over the last 30%, a validation every 200 updates"),
        (6e6, {}, "one model: the budget of the validated one-hour recipe or less"),
        (20e6, {"model": {"members": 2}}, "each member gets about the one-hour recipe's budget"),
        (30e6, {"model": {"members": 3}}, "each member gets about the one-hour recipe's budget"),
    ),
)


@hookimpl
def taskformer_tasks():
    return [TASK]


def _local_splits(data_dir: Path, splits) -> dict[str, list[tuple[str, str]]]:
    return {split: read_parallel(find_file(data_dir, f"{FILES[split]}.de"), find_file(data_dir, f"{FILES[split]}.en"))
            for split in splits}


def _hub_splits() -> dict[str, list[tuple[str, str]]]:
    """The hub copy, for users without local files (never reached by the tests)."""
    try:
        import datasets

        hub = datasets.load_dataset(HUB)
        return {split: list(zip(hub[name]["de"], hub[name]["en"])) for split, name in HUB_SPLITS.items()}
    except Exception as e:  # offline, hub down, renamed dataset: all the same to the user
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"cannot load {HUB} from the Hugging Face hub ({reason}); pass --data-dir DIR with "
                        f"train, val and test_2016_flickr .de/.en files (plain or .gz)") from None


@hookimpl
def taskformer_data(config, data_dir, splits, tokenizer):
    opts = config.data
    pairs = _local_splits(data_dir, splits) if data_dir else _hub_splits()
    train = pairs.get("train", [])
    if 0 < opts.max_train < len(train):  # a seeded subsample, for quick runs (the same on resume)
        keep = random.Random(config.train.seed).sample(range(len(train)), opts.max_train)
        pairs["train"] = [train[i] for i in sorted(keep)]
    if tokenizer is None:  # a new run learns its vocabulary from the train split
        tokenizer = subword((side for pair in pairs["train"] for side in pair), opts.vocab_size, kind=opts.tokenizer)
    source = str(data_dir) if data_dir else f"hub: {HUB}"
    return TaskData(tokenizer=tokenizer, splits=pairs,
                    notes={"data source": source, "tokenizer": f"joint de+en {opts.tokenizer}, train split only"})


@hookimpl
def taskformer_metrics(hypotheses, references):
    """Corpus sacreBLEU on detokenized text (13a, cased), chrF, and lower-cased BLEU as many tutorials report."""
    import sacrebleu  # here: listing the installed tasks imports this module

    return {**translation_metrics(hypotheses, references),
            "bleu_lowercase": sacrebleu.corpus_bleu(hypotheses, [references], lowercase=True).score}


@hookimpl
def taskformer_report_sections(run):
    return cross_attention(run, "German", "English")
