"""``shakespeare-char``: a character-level language model of Tiny Shakespeare, nanoGPT's first experiment.

The data is ``input.txt`` of ``--data-dir`` (``../shared/datasets/tinyshakespeare``), or every
plain-text file of another folder (``*.txt``, in name order, joined). It is split as nanoGPT splits
it: the first 90% of the characters train, the last 10% validate; that split has no test part, so
test is the val text again. The model is decoder-only: it reads blocks of ``model.max_len``
characters and predicts the next one at every position. ``taskformer predict RUN "ROMEO:"``
continues a prompt.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from taskformer import DataError, Task, TaskData, characters, find_file, hookimpl, option, read_lines, subword
from taskformer.tasks.lm import DEFAULTS, METRIC_GROUPS, RECIPES, continuations


@dataclass
class Options:
    """The ``data`` options."""

    tokenizer: str = option("characters", "characters: one token per character, as nanoGPT's shakespeare_char; "
                            "bpe: word pieces learned from the train text.", choices=("characters", "bpe"))
    vocab_size: int = option(1024, "Vocabulary of the bpe tokenizer, the four special tokens included.", at_least=8)
    val_fraction: float = option(0.1, "The last fraction of the characters that validates (and tests).",
                                 above=0.0, below=1.0)


TASK = Task(
    name="shakespeare-char",
    description="Character-level language model of Tiny Shakespeare (nanoGPT's split)",
    variant="decoder-only",
    metric="loss", higher_is_better=False,  # the val loss in nats per character, as nanoGPT reports it
    # lm's network and recipe table (nanoGPT's CPU recipe), validated here: the two cannot drift apart
    metric_groups=METRIC_GROUPS, defaults=DEFAULTS, data_options=Options, recipes=RECIPES,
)


@hookimpl
def taskformer_tasks():
    return [TASK]


def read_text(data_dir) -> str:
    """``input.txt`` (or ``.gz``) of the folder, else all its ``*.txt`` files in name order, joined."""
    if data_dir is None:
        raise DataError("shakespeare-char needs --data-dir: the folder of input.txt (Tiny Shakespeare is at "
                        "../shared/datasets/tinyshakespeare) or of any plain-text files")
    try:
        files = [find_file(data_dir, "input.txt")]
    except DataError:
        files = sorted(p for p in data_dir.iterdir() if p.is_file() and p.name.endswith((".txt", ".txt.gz")))
        if not files:
            raise DataError(f"{data_dir}: no input.txt and no *.txt files") from None
    return "".join("".join(line + "\n" for line in read_lines(path)) for path in files)


def paragraphs(text: str) -> list[tuple[str, str]]:
    """Rows of running text, one per paragraph (each keeps its line breaks): the core joins them into
    one stream again, and the outputs files hold readable pieces instead of one huge row."""
    return [("", piece) for piece in re.split(r"(?<=\n\n)", text) if piece]


@hookimpl
def taskformer_data(config, data_dir, tokenizer):
    opts = config.data
    text = read_text(data_dir)
    cut = int(len(text) * (1 - opts.val_fraction))
    train, val = text[:cut], text[cut:]
    if tokenizer is None:
        tokenizer = (characters([train], whitespace=True) if opts.tokenizer == "characters"
                     else subword([train], opts.vocab_size))
    return TaskData(tokenizer=tokenizer, splits={"train": paragraphs(train), "val": paragraphs(val),
                                                 "test": paragraphs(val)},
                    notes={"data source": str(data_dir), "characters": f"{len(train):,} train, {len(val):,} val",
                           "test": "nanoGPT's split has no test part: test is the val text"})


@hookimpl
def taskformer_report_sections(run):
    return [("Samples", continuations(run))]
