"""``lm``: a decoder-only language model of a user's own text, with no code.

``taskformer run lm --data DIR_OF_TXT`` reads plain text (a file, or a folder of ``.txt`` files in name
order), or a text column of a table, through :mod:`taskformer.core.userdata`. Running text keeps its
order: the last tenth of the characters is held out (val, then test), or whole files where there are
many. Characters are the tokens by default (small data, as nanoGPT's shakespeare_char), BPE with
``--set data.tokenizer=bpe``. The model and recipe are shakespeare-char's (nanoGPT's CPU network).
The core scores loss, perplexity and bits per character; ``predict RUN "PROMPT"`` continues a prompt.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from taskformer import DataError, Task, TaskData, characters, hookimpl, option, subword
from taskformer.core import userdata
from taskformer.core.tokenize import UNK

TEXT = ("text", "content", "document", "body", "sentence")


@dataclass
class Options(userdata.ReadOptions):
    """The ``data`` options: the text column of a table, the tokenizer, how the text is split."""

    text: str = option("", "Text column of a table (a plain-text file has one); empty: the one of text, "
                           "content, document, body, sentence present.")
    tokenizer: str = option("characters", "characters: one token per character, as nanoGPT's shakespeare_char; "
                            "bpe: word pieces learned from the train text.", choices=("characters", "bpe"))
    vocab_size: int = option(1024, "Vocabulary of the bpe tokenizer, the four special tokens included.", at_least=8)


# nanoGPT's CPU recipe: 4 layers of width 128, 4 heads, context 64, 12 blocks a batch, no dropout, 2,000
# updates with a warm-up of 100 and a decay to the end; AdamW's decay of 0.1.
DEFAULTS = {
    "model": {"d_model": 128, "n_heads": 4, "dec_layers": 4, "d_ff": 512, "dropout": 0.0, "max_len": 64},
    "train": {"epochs": 0, "max_steps": 2000, "max_tokens": 12 * 64, "lr": 1e-3, "warmup": 100,
              "schedule": "linear", "label_smoothing": 0.0, "weight_decay": 0.1,
              "eval_every": 500},  # every val token, not nanoGPT's sample of 20 blocks: fewer evaluations
    # nanoGPT's sample.py: temperature 0.8 among the 200 most likely tokens, 500 new ones
    "decode": {"temperature": 0.8, "top_k": 200, "max_new_tokens": 500},
}
# Budgets in target tokens at the pace of the defaults' network (about 50 k tok/s on 2 cores of an
# AVX-512 EPYC). Any time limit trains until the clock ends; about half an hour of that pace and more
# buys a wider, deeper network with a longer context.
RECIPES: tuple[tuple[float, dict[str, dict[str, Any]], str], ...] = (
    (0, {"train": {"max_steps": 0}}, "nanoGPT's CPU network, trained until the clock ends"),
    (90e6, {"model": {"d_model": 256, "n_heads": 8, "dec_layers": 6, "d_ff": 1024, "max_len": 128, "dropout": 0.1},
            "train": {"max_steps": 0, "max_tokens": 32 * 128}},
     "6 layers of width 256 reading 128 characters, 32 blocks a batch, dropout 0.1"),
)
METRIC_GROUPS = {"language model": ["loss", "perplexity", "bits_per_char", "bits_per_token"]}

TASK = Task(name="lm", description="A language model of your own text (decoder-only; characters or BPE)",
            variant="decoder-only", metric="loss", higher_is_better=False, metric_groups=METRIC_GROUPS,
            defaults=DEFAULTS, data_options=Options, recipes=RECIPES)


@hookimpl
def taskformer_tasks():
    return [TASK]


def running_rows(source: userdata.Source, split: str, column: str) -> Any:
    """A split as ``(prompt, text)`` rows of a ``datasets.Dataset`` with no prompt: running text,
    joined into one stream by the core. Documents of a table are separated by a blank line in the
    stream; the paragraphs of plain text keep their own."""
    from datasets.fingerprint import generate_random_fingerprint  # here: listing the tasks imports this module

    rows = source.dataset(split, [column], ["target"])
    if not source.running:
        rows = rows.map(lambda batch: {"target": [t.rstrip("\n") + "\n\n" for t in batch["target"]]}, batched=True)
    # a fingerprint of our own: datasets would otherwise pickle the whole column to make one
    return rows.add_column("source", [""] * len(rows), new_fingerprint=generate_random_fingerprint())


def characters_in(rows) -> int:
    import pyarrow.compute as pc

    return int(pc.sum(pc.utf8_length(rows.with_format("arrow")["target"])).as_py() or 0)


@hookimpl
def taskformer_data(task, config, data_dir, tokenizer):
    opts = config.data
    source = userdata.read(userdata.location(data_dir, task.name), opts, lm=True)
    column = source.pick("text", opts.text, TEXT)[0]
    splits = {split: running_rows(source, split, column) for split in userdata.SPLITS}
    if not len(splits["train"]):
        raise DataError(f"{source.location}: the train split holds no text")
    if tokenizer is None:  # from the train text a batch of rows at a time, never the whole text at once
        texts = (text for batch in userdata.batches(splits["train"]) for text in batch["target"])
        tokenizer = characters(texts, whitespace=True) if opts.tokenizer == "characters" else subword(texts, opts.vocab_size)
    source.notes["characters"] = ", ".join(f"{s} {characters_in(splits[s]):,}" for s in userdata.SPLITS)
    userdata.tell(source)
    return TaskData(tokenizer=tokenizer, splits=splits, notes=source.notes)


@hookimpl
def taskformer_report_sections(run):
    return [("Samples", continuations(run))]


def continuations(run, count: int = 3, longest: int = 200) -> Any:
    """Continuations of a few val lines (the first of each paragraph, then the first paragraph's others),
    with the run's decode settings (at most ``longest`` tokens each), shown as they ran: each prompt
    once (a seeded search continues it alike every time), whole lines only (the held-out text may
    begin inside a line, so the first one is left out), the part of a long prompt the model read,
    what it read as ``[UNK]`` named, and line breaks marked ``↵``."""
    from dataclasses import replace

    import torch
    from rich.table import Table

    from taskformer import search

    texts = [text for _, _, text in run.samples.get("val", [])]
    lines = [text.split("\n")[0] for text in texts[1:]] + [line for text in texts[:1] for line in text.split("\n")[1:]]
    prompts = list(dict.fromkeys(line for line in lines if line.strip()))[:count]
    decode = replace(run.config.decode, max_new_tokens=min(run.config.decode.max_new_tokens, longest))
    table = Table(show_lines=True)
    for column in ("prompt", "continuation"):
        table.add_column(column, overflow="fold")  # a long word is folded, never cut with an ellipsis
    outputs, notes = [], ["↵ marks a line break"]
    for prompt in prompts:
        encoding = run.tokenizer.encode(prompt)
        read = max(len(encoding.ids) - run.model.cfg.max_len, 0)  # the model reads the last max_len tokens
        unknown = dict.fromkeys(prompt[a:b] for t, (a, b) in zip(encoding.ids[read:], encoding.offsets[read:]) if t == UNK)
        src = torch.tensor([encoding.ids[read:]], device=run.device)
        outputs.append(run.tokenizer.decode(search(run.model.eval(), src, decode)[0]))
        shown = "…" + prompt[encoding.offsets[read][0]:] if read else prompt
        table.add_row(shown + (f"\n(read as [UNK]: {' '.join(unknown)})" if unknown else ""),
                      outputs[-1].replace("\n", "↵\n"))
    if repeated := len(outputs) - len(set(outputs)):
        notes.append(f"{repeated} continuation{'s' * (repeated > 1)} repeat{'s' * (repeated == 1)} an earlier one word "
                     "for word")
    table.caption = "; ".join(notes)
    return table
