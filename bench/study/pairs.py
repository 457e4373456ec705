"""Sentence pairs read as a pair (``Task(pairs=True)``) against the same pairs as one line, ``PREMISE ||| HYPOTHESIS``.

No public inference set is on disk, so the pairs are made here, deterministically: a premise states one
to three facts about people (``anna sees tom and ben does not call nina``), a hypothesis one fact, and
its label is

- ``entailment``: the hypothesis is one of the premise's facts;
- ``contradiction``: it is one of them negated, or un-negated;
- ``neutral``: the premise does not speak of it: another fact, or one of its facts with the roles
  reversed (``tom sees anna``), so that word order matters and which text says what matters.

Both encodings train the same network on the same rows (``--data-seed``) with the same budget, for
each training seed, and the val and test accuracy of each are printed side by side, with the updates
each run made (``--time-limit`` is wall time: the two encodings take turns going first; ``--steps``
gives both the same updates).

    python bench/study/pairs.py [--time-limit 3 | --steps N] [--seeds 0 1 2] [--size 6000] [--out DIR]
"""
from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from taskformer import Task, TaskData, hookimpl, option, symbols
from taskformer.app import runner
from taskformer.testing import plugin

NAMES = "anna tom maria paul lena omar yuki sara ben nina".split()
VERBS = [("sees", "see"), ("helps", "help"), ("calls", "call"), ("visits", "visit"), ("trusts", "trust"),
         ("follows", "follow"), ("thanks", "thank"), ("meets", "meet")]
LABELS = ["entailment", "neutral", "contradiction"]
JOIN = "|||"  # the one-line encoding's separator, as the plugin author wrote it


@dataclass
class Options:
    size: int = option(6000, "Pairs made: 10% validate, 10% test, the rest train.", at_least=30)
    seed: int = option(0, "Seed of the pairs (the same rows for both encodings, whatever the training seed).")


DEFAULTS = {"model": {"d_model": 128, "n_heads": 4, "enc_layers": 3, "d_ff": 256, "dropout": 0.1, "max_len": 64},
            "train": {"epochs": 0, "max_tokens": 2048, "lr": 1e-3, "warmup": 100}}  # the budget ends it
ENCODINGS = {"pairs": "pair: [BOS] P [EOS] H [EOS] + segments", "line": f"one line: P {JOIN} H"}
TASKS = {name: Task(name=f"nli-{name}", description=f"synthetic inference, {what}", variant="encoder-only",
                    pairs=name == "pairs", metric="accuracy", defaults=DEFAULTS, data_options=Options)
         for name, what in ENCODINGS.items()}


def fact(rng: random.Random) -> tuple[str, int, str, bool]:
    """(subject, verb, object, negated)."""
    subject, obj = rng.sample(NAMES, 2)
    return subject, rng.randrange(len(VERBS)), obj, rng.random() < 0.3


def said(f: tuple[str, int, str, bool]) -> str:
    subject, verb, obj, negated = f
    return f"{subject} does not {VERBS[verb][1]} {obj}" if negated else f"{subject} {VERBS[verb][0]} {obj}"


def example(rng: random.Random) -> tuple[tuple[str, str], str]:
    facts: dict[tuple[str, int, str], bool] = {}  # (subject, verb, object) -> negated
    count = rng.randint(1, 3)
    while len(facts) < count:
        subject, verb, obj, negated = fact(rng)
        facts.setdefault((subject, verb, obj), negated)
    label = rng.choice(LABELS)
    (subject, verb, obj), negated = rng.choice(list(facts.items()))
    if label == "entailment":
        hypothesis = subject, verb, obj, negated
    elif label == "contradiction":
        hypothesis = subject, verb, obj, not negated
    else:  # roles reversed, or another fact; never one the premise speaks of
        hypothesis = (obj, verb, subject, rng.random() < 0.3) if rng.random() < 0.5 else fact(rng)
        while hypothesis[:3] in facts:
            hypothesis = fact(rng)
    return (" and ".join(said((*key, neg)) for key, neg in facts.items()), said(hypothesis)), label


def pairs(size: int, seed: int) -> dict[str, list]:
    rng, labels = random.Random(seed), dict[tuple[str, str], str]()
    while len(labels) < size:  # each pair once, so that no val or test pair is also a training pair
        pair, label = example(rng)
        labels.setdefault(pair, label)
    rows = list(labels.items())
    held = size // 10
    return {"val": rows[:held], "test": rows[held : 2 * held], "train": rows[2 * held :]}


class Synthetic:
    """The two tasks, one per encoding, over the same rows."""

    @hookimpl
    def taskformer_tasks(self):
        return list(TASKS.values())

    @hookimpl
    def taskformer_data(self, task, config):
        splits = pairs(config.data.size, config.data.seed)
        if not task.pairs:
            splits = {name: [(f"{premise} {JOIN} {hypothesis}", label) for (premise, hypothesis), label in rows]
                      for name, rows in splits.items()}
        words = NAMES + [w for v in VERBS for w in v] + ["and", "does", "not", JOIN]
        return TaskData(tokenizer=symbols(words), splits=splits, labels=LABELS)

    @hookimpl
    def taskformer_metrics(self, hypotheses, references):
        return {"accuracy": 100.0 * sum(h.label == r for h, r in zip(hypotheses, references)) / len(references)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    budget = ap.add_mutually_exclusive_group()
    budget.add_argument("--time-limit", type=float, default=3.0, help="minutes per run, each encoding and seed")
    budget.add_argument("--steps", type=int, help="updates per run instead of a time limit")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds")
    ap.add_argument("--size", type=int, default=6000, help="pairs made (train, val and test)")
    ap.add_argument("--data-seed", type=int, default=0, help="seed of the pairs")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a setting for both encodings, e.g. model.d_model=64")
    ap.add_argument("--out", type=Path, help="keep the run directories here (default: a temporary folder)")
    args = ap.parse_args()

    settings = [f"data.size={args.size}", f"data.seed={args.data_seed}", *args.overrides]
    if args.steps:
        settings.append(f"train.max_steps={args.steps}")
    scores: dict[str, list[tuple[float, float]]] = {name: [] for name in ENCODINGS}
    with tempfile.TemporaryDirectory() as scratch, plugin(Synthetic(), "bench-pairs"):
        root = args.out or Path(scratch)
        for i, seed in enumerate(args.seeds):
            # the encodings take turns going first: a process's first run also pays its start-up
            for name in list(ENCODINGS)[:: 1 if i % 2 == 0 else -1]:
                run = runner.train_task(TASKS[name].name, out=str(root / f"{name}-seed{seed}"), seed=seed,
                                   time_limit=None if args.steps else args.time_limit, overrides=tuple(settings))
                scores[name].append((run.metrics["val"]["accuracy"], run.metrics["test"]["accuracy"]))
                print(f"seed {seed} {name:5}  val {scores[name][-1][0]:6.2f}  test {scores[name][-1][1]:6.2f}  "
                      f"({run.info.get('steps')} updates)", flush=True)
    budget_said = f"{args.steps} updates" if args.steps else f"--time-limit {args.time_limit:g}"
    print(f"\n{args.size} pairs (data seed {args.data_seed}), {budget_said} per run, seeds {args.seeds}")
    print(f"{'encoding (mean over seeds)':40} {'val accuracy':>14} {'test accuracy':>14}")
    for name, what in ENCODINGS.items():
        val, test = zip(*scores[name])
        print(f"{what:40} {statistics.mean(val):14.2f} {statistics.mean(test):14.2f}")


if __name__ == "__main__":
    main()
