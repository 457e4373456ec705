"""``translate-de-en``: German to English on Multi30k (task 1, Flickr30k captions), scored with sacreBLEU.

Data: ``train``, ``val`` and ``test_2016_flickr`` as line-aligned ``.de``/``.en`` files (plain or
gzip) under ``--data-dir``, the layout of the original release; without ``--data-dir`` the Hugging
Face hub copy ``bentrevett/multi30k`` is downloaded. One BPE vocabulary is trained on both sides of
the train split, so source, target and output layer share one embedding matrix: German and English
captions share many names, numbers and word pieces, and tying saves a third of a small model's parameters.
"""
from __future__ import annotations

import random
from pathlib import Path

from taskformer import (
    DataError,
    Task,
    TaskData,
    cross_attention,
    find_file,
    hookimpl,
    read_parallel,
    subword,
)
from taskformer.tasks.seq2seq import DEFAULTS, RECIPES, PairOptions, scores

FILES = {"train": "train", "val": "val", "test": "test_2016_flickr"}  # split -> file stem of the release
HUB = "bentrevett/multi30k"
HUB_SPLITS = {"train": "train", "val": "validation", "test": "test"}

TASK = Task(
    name="translate-de-en",
    description="German to English translation on Multi30k, scored with sacreBLEU",
    variant="encoder-decoder",
    metric="bleu",
    examples=("Ein Hund rennt über die Wiese.", "Zwei Kinder spielen am Strand im Sand.",
              "Eine Frau mit einem roten Hut fährt Fahrrad."),
    languages=("de", "en"),
    higher_is_better=True,
    # translate's model, decoding and recipe table, validated here (docs/results.md): they cannot drift apart
    defaults=DEFAULTS,
    data_options=PairOptions,
    recipes=RECIPES,
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
    """Corpus sacreBLEU on detokenized text (13a, cased), chrF, and lower-cased BLEU, as ``translate`` scores."""
    return scores(hypotheses, references)


@hookimpl
def taskformer_report_sections(run):
    return cross_attention(run, "German", "English")
