"""A task plugin that guards every hook with the task's name and calls ``greedy`` directly.

Per-task dispatch makes the guards unnecessary, but a plugin may still have them: the tests register
it beside the built-in tasks, and it must train and predict, while its per-task hooks are never
called for another task (``HEARD`` records every task they were called for).
"""
import random
from dataclasses import dataclass

from taskformer import Task, TaskData, greedy, hookimpl, option, symbols

HEARD: set[str] = set()
SMALL = dict(d_model=32, n_heads=2, enc_layers=1, dec_layers=1, d_ff=64, dropout=0.0, max_len=16)


@dataclass
class Options:
    length: int = option(5, "Digits per sequence.", at_least=1)
    train_size: int = option(600, "Training sequences.", at_least=1)


TASK = Task("legacy-sort", "Sort a sequence of digits (a plugin with guards)", metric="exact_match",
            defaults={"model": SMALL, "train": dict(epochs=1, max_tokens=512, lr=3e-3, warmup=10)},
            data_options=Options)


@hookimpl
def taskformer_tasks():
    return [TASK]


@hookimpl
def taskformer_data(task, config):
    HEARD.add(task.name)
    if task.name != TASK.name:
        return None
    rng, length = random.Random(config.train.seed), config.data.length

    def pairs(n):
        rows = [[rng.choice("0123456789") for _ in range(length)] for _ in range(n)]
        return [(" ".join(row), " ".join(sorted(row))) for row in rows]

    return TaskData(tokenizer=symbols(list("0123456789")),
                    splits={"train": pairs(config.data.train_size), "val": pairs(40), "test": pairs(40)})


@hookimpl
def taskformer_decode(task, model, src, tokenizer, config):
    HEARD.add(task.name)
    if task.name != TASK.name:
        return None
    steps = (src != 0).sum(1) - 1
    return [tokenizer.decode(ids) for ids in greedy(model, src, steps, ignore_eos=True)]


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
                               f"length {run.config.data.length}")]
