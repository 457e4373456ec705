"""``translate-en-zh``: English to Chinese on the Tatoeba pairs of the classic "write your own
Transformer" tutorial, scored with sacreBLEU's Chinese tokenizer.

Data: the tutorial's ``train.txt``, ``dev.txt`` and ``test.txt`` under ``--data-dir`` (plain or
gzip), one ``English<TAB>Chinese`` pair per line; ``dev`` is the validation split. There is no copy
to download: the task says where to get the files.

One vocabulary is trained on both sides of the train split and shared by source, target and output
layer (English names such as Tom also occur on the Chinese side). By default every Chinese
character is a token of its own, beside English BPE subwords, as the tutorial writes Chinese:
sacreBLEU's zh tokenizer scores characters, and on 14.5k pairs a Chinese BPE sees most of its
multi-character pieces only a few times. ``data.chinese=subword`` lets BPE merge Chinese too
(targets about a third shorter, so more epochs in the same time). Text is normalized with NFC, not
NFKC, which would make the full-width punctuation of the references (，？！) half-width; outputs
decode to natural Chinese, no spaces between characters. Simplified and traditional characters are
left as they are, and references are scored exactly as read.
"""
from __future__ import annotations

from dataclasses import dataclass

import taskformer
from taskformer import (
    CJK,
    DataError,
    Task,
    TaskData,
    hookimpl,
    option,
    read_tsv,
    subword,
    translation_metrics,
)

FILES = {"train": "train.txt", "val": "dev.txt", "test": "test.txt"}
WHERE = ("translate-en-zh needs --data-dir DIR with train.txt, dev.txt and test.txt (plain or .gz), one "
         "'English<TAB>Chinese' pair per line: the en-cn files of the classic Transformer tutorial (nmt/en-cn/ in "
         "github.com/zhouweigogogo/SimpleTransformer), pairs from Tatoeba's cmn.txt (tatoeba.org, CC-BY 2.0 FR)")


@dataclass
class Options:
    """The ``data`` options: the size of the joint en+zh vocabulary, and whether Chinese is split
    into ``characters`` (default) or left to BPE as ``subword`` pieces."""

    vocab_size: int = option(8000, "Size of the joint en+zh vocabulary.", at_least=100)
    chinese: str = option("characters", "Split Chinese into characters, or leave it to BPE as subword pieces.",
                          choices=("characters", "subword"))


TASK = Task(
    name="translate-en-zh",
    description="English to Chinese translation on Tatoeba pairs (the tutorial's en-cn split), sacreBLEU zh",
    metric="bleu",
    examples=("Where is the train station?", "I like reading books.", "It is raining today."),
    languages=("en", "zh"),
    # The core's model otherwise (d_model 256, 3+3 layers, tied embeddings, beam 5). A 30-minute CPU
    # run is short in updates, so batches are half the core's size and the warm-up half as long
    # (chosen on dev, docs/results.md): the core's 400 warm-up steps are most of such a run. More
    # dropout keeps many passes over 14.5k pairs from overfitting; ``--time-limit`` ends training
    # before the epoch cap.
    # Chinese runs about 1.35 characters per English token: room for long outputs.
    defaults={"model": {"dropout": 0.2}, "train": {"epochs": 60, "max_tokens": 2048, "warmup": 200},
              "decode": {"max_len_a": 1.5}},
    data_options=Options,
)


@hookimpl
def taskformer_tasks():
    return [TASK]


def read_splits(data_dir, splits) -> dict[str, list[tuple[str, str]]]:
    if data_dir is None:
        raise DataError(WHERE)
    return {split: read_tsv(taskformer.find_file(data_dir, FILES[split])) for split in splits}


@hookimpl
def taskformer_data(config, data_dir, splits, tokenizer):
    opts = config.data
    pairs = read_splits(data_dir, splits)
    isolate = CJK if opts.chinese == "characters" else None
    if tokenizer is None:  # a new run learns its vocabulary from the train split
        texts = [side for pair in pairs["train"] for side in pair]
        tokenizer = subword(texts, opts.vocab_size, normalization="NFC", isolate=isolate)
    kind = "Chinese characters + English BPE" if isolate else "joint en+zh BPE"
    return TaskData(tokenizer=tokenizer, splits=pairs,
                    notes={"data source": str(data_dir), "tokenizer": f"{kind}, train split only"})


@hookimpl
def taskformer_metrics(hypotheses, references):
    """sacreBLEU with its Chinese tokenizer (each Chinese character a word) and chrF."""
    return translation_metrics(hypotheses, references, tokenize="zh")


@hookimpl
def taskformer_report_sections(run):
    return taskformer.cross_attention(run, "English", "Chinese")
