"""A task plugin written for the plugin API as it was before per-task dispatch, kept that way on purpose.

It imports from the old module paths, declares its data options as a dict, reads the config as a
nested dict, calls ``greedy`` directly and guards every hook with the task's name. The tests register
it beside the built-in tasks: it must keep training and predicting, and its per-task hooks must never
be called for another task (``HEARD`` records every task they were called for).
"""
import random

from taskformer.core import decoding
from taskformer.core.data import TaskData
from taskformer.core.tokenize import symbols
from taskformer.plugins import Task, hookimpl

HEARD = set()
SMALL = dict(d_model=32, n_heads=2, enc_layers=1, dec_layers=1, d_ff=64, dropout=0.0, max_len=16)
TASK = Task("legacy-sort", "Sort a sequence of digits (a plugin on the old API)", metric="exact_match",
            defaults={"model": SMALL, "train": dict(epochs=1, max_tokens=512, lr=3e-3, warmup=10),
                      "data": {"length": 5, "train_size": 600}})


@hookimpl
def taskformer_tasks():
    return [TASK]


@hookimpl
def taskformer_data(task, config):
    HEARD.add(task.name)
    if task.name != TASK.name:
        return None
    rng, length = random.Random(config["train"]["seed"]), config["data"]["length"]

    def pairs(n):
        rows = [[rng.choice("0123456789") for _ in range(length)] for _ in range(n)]
        return [(" ".join(row), " ".join(sorted(row))) for row in rows]

    return TaskData(tokenizer=symbols(list("0123456789")),
                    splits={"train": pairs(config["data"]["train_size"]), "val": pairs(40), "test": pairs(40)})


@hookimpl
def taskformer_decode(task, model, src, tokenizer, config):
    HEARD.add(task.name)
    if task.name != TASK.name:
        return None
    steps = (src != 0).sum(1) - 1
    return [tokenizer.decode(ids) for ids in decoding.greedy(model, src, steps, ignore_eos=True)]


@hookimpl
def taskformer_metrics(task, hypotheses, references):
    HEARD.add(task.name)
    if task.name != TASK.name:
        return None
    return {"exact_match": 100.0 * sum(h == r for h, r in zip(hypotheses, references)) / len(references)}


@hookimpl
def taskformer_report_sections(task, run):
    HEARD.add(task.name)
    if task.name != TASK.name:
        return None
    rows = run.samples["test"]
    return [("Sorted samples", f"{sum(h == r for _, h, r in rows)} of {len(rows)}, "
                               f"length {run.config['data']['length']}")]
