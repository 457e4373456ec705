"""The ``reverse`` taskformer plugin: the model learns to reverse a sequence of digits.

Written by ``taskformer new-task``: a complete, working task to edit into your own. It is found
through the ``taskformer`` entry point declared in ``pyproject.toml``; docs/plugins.md in the
taskformer repository explains every hook used here.
"""
import random
from dataclasses import dataclass

import click
from rich.table import Table

from taskformer import PAD, Task, TaskData, hookimpl, option, symbols

DIGITS = list("0123456789")


@dataclass
class Options:
    """The task's ``data`` options: ``--set data.length=8`` changes one."""

    length: int = option(6, "Digits per sequence.", at_least=1)
    train_size: int = option(4000, "Training sequences.", at_least=1)


TASK = Task(
    name="reverse",
    description="Reverse a sequence of digits (reverse plugin)",
    metric="exact_match",
    defaults={
        "model": {"d_model": 64, "n_heads": 4, "enc_layers": 1, "dec_layers": 1, "d_ff": 128, "dropout": 0.0,
                  "max_len": 32},
        "train": {"epochs": 3, "max_tokens": 1024, "lr": 3e-3, "warmup": 50, "label_smoothing": 0.0},
        "decode": {"strategy": "greedy"},  # predict --beam 4 switches to beam search
    },
    data_options=Options,
)


@hookimpl
def taskformer_tasks():
    return [TASK]


def sample(rng: random.Random, n: int, length: int) -> list[tuple[str, str]]:
    seqs = [[rng.choice(DIGITS) for _ in range(length)] for _ in range(n)]
    return [(" ".join(s), " ".join(reversed(s))) for s in seqs]


@hookimpl
def taskformer_data(config):
    rng, length = random.Random(config.train.seed), config.data.length
    return TaskData(tokenizer=symbols(DIGITS),
                    splits={"train": sample(rng, config.data.train_size, length),
                            "val": sample(rng, 200, length), "test": sample(rng, 200, length)})


@hookimpl
def taskformer_decode(model, src, tokenizer, config):
    from taskformer import search  # imported where it runs: it loads torch, which listing the tasks does not need

    # The answer is exactly as long as the question: search with that budget.
    budget = (src != PAD).sum(1) - 1  # as many tokens as the source, without its EOS
    ids = search(model, src, config.decode, max_len=budget, ignore_eos=True)
    return [tokenizer.decode(x) for x in ids]


@hookimpl
def taskformer_metrics(hypotheses, references):
    hits = sum(h == r for h, r in zip(hypotheses, references))
    return {"exact_match": 100.0 * hits / len(references)}


@hookimpl
def taskformer_report_sections(run):
    table = Table("position", "correct %")
    rows = [(h.split(), r.split()) for _, h, r in run.outputs.get("test", [])]
    for i in range(run.config.data.length):
        right = sum(len(h) > i and h[i] == r[i] for h, r in rows)
        table.add_row(str(i + 1), f"{100.0 * right / max(len(rows), 1):.1f}")
    return [("Accuracy by position", table)]


@hookimpl
def taskformer_register_commands(cli):
    @cli.command("reverse-examples")
    @click.option("-n", default=3, help="How many examples.")
    def examples(n):
        """Print a few examples of the reverse task."""
        for source, target in sample(random.Random(0), n, Options().length):
            click.echo(f"{source}\t{target}")
