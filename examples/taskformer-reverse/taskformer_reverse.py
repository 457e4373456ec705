"""The ``reverse`` taskformer plugin: the model learns to reverse a sequence of digits.

Written by ``taskformer new-task``: a complete, working task to edit into your own. It is found
through the ``taskformer`` entry point declared in ``pyproject.toml``; docs/plugins.md in the
taskformer repository explains every hook used here.
"""
import random

import click
from rich.table import Table

from taskformer.core import decoding
from taskformer.core.data import TaskData
from taskformer.core.tokenize import symbols
from taskformer.plugins import Task, hookimpl

DIGITS = list("0123456789")
TASK = Task(
    name="reverse",
    description="Reverse a sequence of digits (reverse plugin)",
    metric="exact_match",
    defaults={
        "model": {"d_model": 64, "n_heads": 4, "enc_layers": 1, "dec_layers": 1, "d_ff": 128, "dropout": 0.0,
                  "max_len": 32},
        "train": {"epochs": 3, "max_tokens": 1024, "lr": 3e-3, "warmup": 50, "label_smoothing": 0.0},
        "data": {"length": 6, "train_size": 4000},
    },
)


@hookimpl
def taskformer_tasks():
    return [TASK]


def sample(rng: random.Random, n: int, length: int) -> list[tuple[str, str]]:
    seqs = [[rng.choice(DIGITS) for _ in range(length)] for _ in range(n)]
    return [(" ".join(s), " ".join(reversed(s))) for s in seqs]


@hookimpl
def taskformer_data(task, config):
    if task.name != TASK.name:
        return None
    rng, length = random.Random(config["train"]["seed"]), config["data"]["length"]
    return TaskData(tokenizer=symbols(DIGITS),
                    splits={"train": sample(rng, config["data"]["train_size"], length),
                            "val": sample(rng, 200, length), "test": sample(rng, 200, length)})


@hookimpl
def taskformer_decode(task, model, src, tokenizer):
    if task.name != TASK.name:
        return None
    # The answer is exactly as long as the question: greedy search with that budget.
    # (src ends with an EOS the core appends, hence the -1.)
    budget = (src != 0).sum(1) - 1
    return [tokenizer.decode(ids) for ids in decoding.greedy(model, src, budget, ignore_eos=True)]


@hookimpl
def taskformer_metrics(task, hypotheses, references):
    if task.name != TASK.name:
        return None
    hits = sum(h == r for h, r in zip(hypotheses, references))
    return {"exact_match": 100.0 * hits / len(references)}


@hookimpl
def taskformer_report_sections(task, run):
    if task.name != TASK.name:
        return None
    table = Table("position", "correct %")
    rows = [(h.split(), r.split()) for _, h, r in run.outputs.get("test", [])]
    for i in range(run.config["data"]["length"]):
        right = sum(len(h) > i and h[i] == r[i] for h, r in rows)
        table.add_row(str(i + 1), f"{100.0 * right / max(len(rows), 1):.1f}")
    return [("Accuracy by position", table)]


@hookimpl
def taskformer_register_commands(cli):
    @cli.command("reverse-examples")
    @click.option("-n", default=3, help="How many examples.")
    def examples(n):
        """Print a few examples of the reverse task."""
        for source, target in sample(random.Random(0), n, TASK.defaults["data"]["length"]):
            click.echo(f"{source}\t{target}")
