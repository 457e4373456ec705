"""An external taskformer plugin: reverse a sequence of digits.

It lives outside taskformer and is found through the ``taskformer`` entry point declared in its
``pyproject.toml`` -- exactly the path a third-party plugin takes. It uses the core's default
head and decoder, so it only declares the task, its data and its metric.
"""
import random

from taskformer.core.data import TaskData
from taskformer.core.tokenize import symbols
from taskformer.plugins import Task, hookimpl

DIGITS = list("0123456789")
TASK = Task(
    name="reverse",
    description="Reverse a sequence of digits (example external plugin)",
    metric="exact_match",
    defaults={
        "model": {"d_model": 64, "n_heads": 4, "enc_layers": 1, "dec_layers": 1, "d_ff": 128, "dropout": 0.0,
                  "max_len": 32},
        "train": {"epochs": 3, "max_tokens": 1024, "lr": 3e-3, "warmup": 50, "label_smoothing": 0.0},
        "decode": {"strategy": "greedy", "max_len_a": 1.0, "max_len_b": 2},
        "data": {"length": 6, "train_size": 4000},
    },
)


@hookimpl
def taskformer_tasks():
    return [TASK]


@hookimpl
def taskformer_data(task, config):
    if task.name != TASK.name:
        return None
    rng = random.Random(config["train"]["seed"])
    length = config["data"]["length"]

    def pairs(n):
        seqs = [[rng.choice(DIGITS) for _ in range(length)] for _ in range(n)]
        return [(" ".join(s), " ".join(reversed(s))) for s in seqs]

    return TaskData(tokenizer=symbols(DIGITS),
                    splits={"train": pairs(config["data"]["train_size"]), "val": pairs(200), "test": pairs(200)})


@hookimpl
def taskformer_metrics(task, hypotheses, references):
    if task.name != TASK.name:
        return None
    hits = sum(h == r for h, r in zip(hypotheses, references))
    return {"exact_match": 100.0 * hits / len(references)}
