"""A time limit as the budget: how fast this machine trains, and the recipe that budget buys.

A recipe sized for one machine wastes the hour of a faster one: the same small model stops early
(or over-fits) while the clock still runs. So before a time-limited run trains, it measures its
pace -- target tokens per second of training updates -- and pace x time limit is its budget in
target tokens. A task's recipe table (``Task.recipes``) says what a budget of that size should
change: rows of (minimum budget in target tokens, config overrides, the reason), the largest row
the budget reaches wins, and below the first row the first row trains and the run says the budget
is short. A table that starts at 0 has a recipe for every budget.

Nothing here knows a task: the app passes the table, the model and the data.
"""
from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from taskformer.core import clock
from taskformer.core.data import Encoded, collate
from taskformer.core.engine import Trainer, forked_random
from taskformer.core.errors import TaskformerError
from taskformer.core.model import Ensemble, Transformer
from taskformer.core.train_config import TrainConfig

# Evaluations without improvement after which a time-limited run stops when no train.patience is set.
# Ten evaluations ride out the noise of val scores and the plateaus a falling rate or an average of
# the last checkpoints climbs out of, and still stop a model that has begun to over-fit long before a
# large budget is spent.
TIME_LIMIT_PATIENCE = 10
PROBE_SECONDS = 3.0  # timed updates of the pace probe: until this much time has passed ...
PROBE_UPDATES = (2, 20)  # ... but at least 2 and at most 20 updates, after one untimed one
# On a GPU an update is a tenth of a second once its kernels are chosen, and the first ones of each new
# shape cost far more: the probe times this many at least, so that their median is a steady one.
PROBE_GPU_UPDATES = 10
RECIPE_SECTIONS = ("model", "train", "decode")
# The warm-up of a short budget: at most this share of the updates the budget buys. A warm-up longer
# than the run never reaches the peak rate (a 1,000-update warm-up in a 400-update run).
WARMUP_SHARE = 0.1


def time_limit_layer(train_defaults: dict) -> dict:
    """The config layer a time limit adds below the user's settings: no epoch cap (the clock is the
    budget) and, unless the task's defaults set one, ``TIME_LIMIT_PATIENCE``."""
    return {"train": {"epochs": 0, "patience": train_defaults.get("patience") or TIME_LIMIT_PATIENCE}}


class Recipe(NamedTuple):
    """A row of a task's recipe table (``Task.recipes``): from a budget of ``minimum`` target tokens, the
    ``overrides`` ``{section: {key: value}}`` of sections ``RECIPE_SECTIONS``, for the one-line ``reason``.
    A plugin declares a row as the plain tuple ``(minimum, overrides, reason)``."""

    minimum: float
    overrides: dict[str, dict[str, Any]]
    reason: str

    @classmethod
    def of(cls, row: object, owner: str) -> Recipe:
        """``row`` as declared (a tuple or list of three), refused with ``owner`` named where malformed."""
        minimum, overrides, reason = row if isinstance(row, (tuple, list)) and len(row) == 3 else (None, None, None)
        if not (isinstance(minimum, (int, float)) and not isinstance(minimum, bool) and minimum >= 0
                and isinstance(overrides, dict) and isinstance(reason, str) and set(overrides) <= set(RECIPE_SECTIONS)):
            raise TaskformerError(f"{owner}: each recipe is (minimum target tokens >= 0, {{section: {{key: value}}}} "
                                  f"with sections {', '.join(RECIPE_SECTIONS)}, a one-line reason), got {row!r:.120}")
        return cls(float(minimum), overrides, reason)


def check_table(recipes: Iterable[object], owner: str) -> list[Recipe]:
    """The rows of a recipe table in order of their minimum, refusing a malformed one."""
    return sorted((Recipe.of(row, owner) for row in recipes), key=lambda r: r.minimum)


def choose(recipes: Iterable[object], owner: str, pace: float, seconds_for: Callable[[dict], float], source: str,
           batching: Callable[[dict], tuple[float, int]], left: float | None = None) -> dict:
    """The recipe for ``pace`` target tokens/s, as the record a run keeps.

    ``seconds_for(overrides)`` is the training time a row leaves (what remains of the time limit
    after the row's own final evaluation: an ensemble's takes longer); the largest row whose minimum
    its budget reaches wins. ``source`` says where the pace came from (measured, or ``train.pace``);
    ``batching(overrides)`` gives the updates per target token of a row's config and its warm-up,
    from which the planned updates follow. ``left``, the training time before any row keeps back its
    final evaluation, passes over the rows whose minimum even that cannot reach without asking
    ``seconds_for`` (which may time the row's decoding). Below the smallest row the smallest recipe trains, and
    the record's ``short`` says so with the budget that would reach it. The record holds the pace,
    the budget, the overrides picked (the warm-up cut to ``WARMUP_SHARE`` of the planned updates,
    or of ``clock.FEW_UPDATES`` where fewer are planned, where it was longer) and ``why``, one line a person reads.
    """
    rows = check_table(recipes, owner) or [Recipe(0.0, {}, "the task declares no recipes by budget")]
    for i, (minimum, overrides, reason) in reversed(list(enumerate(rows))):  # noqa: B007 -- else: the smallest row
        if i and left is not None and minimum > pace * left:
            continue  # out of reach whatever the row keeps back
        seconds = seconds_for(overrides)
        if minimum <= pace * seconds:
            break
    budget = pace * seconds
    per_token, warmup = batching(overrides)
    planned = max(round(budget * per_token), 1)
    # A warm-up the run would never finish is cut to a share of the plan, but never below that of the least
    # plan that learns: a probe on a busy machine plans few updates, and the run (whose decay follows the
    # time) makes more once the machine frees up; a warm-up of one or two would start it at the peak rate.
    cut = max(round(WARMUP_SHARE * max(planned, clock.FEW_UPDATES)), 1)
    if warmup > cut:  # and under the clock, a share of the time: a busy start does not fix it in updates
        overrides = {**overrides, "train": {**overrides.get("train", {}), "warmup": cut, "warmup_share": WARMUP_SHARE}}
    name = describe(overrides)
    why = (f"{name}: {pace:,.0f} tok/s ({source}) × {seconds / 60:.1f} min of training = {tokens(budget)} target "
           f"tokens, about {planned:,} updates (from {tokens(minimum)}: {reason})")
    record = {"name": name, "overrides": overrides, "pace": round(pace), "pace_source": source,
              "train_seconds": round(seconds, 1), "budget_tokens": round(budget), "minimum_tokens": round(minimum),
              "planned_updates": planned, "updates_per_second": max(pace * per_token, 1e-9), "why": why}
    if budget < minimum:
        record["short"] = (f"the budget, {tokens(budget)} target tokens, is below the {tokens(minimum)} that the task's "
                           f"smallest recipe needs; about {minimum / pace / 60:.1f} min of training would reach it")
    return record


def describe(overrides: dict) -> str:
    """``{"model": {"members": 3}}`` -> ``model.members=3``; no overrides: the task's defaults."""
    settings = [f"{section}.{key}={value}" for section, values in overrides.items() for key, value in values.items()]
    return ", ".join(settings) or "the task's defaults"


def tokens(n: float) -> str:
    """A token count as a person reads it: 36 M, 850 k, 19.9 M. Three significant digits, cut, never
    rounded up: a budget just below a recipe's 20 M reads 19.9 M, not the 20 M it falls short of."""
    n = max(int(n), 0)
    if n < 1000:
        return f"{n:,}"
    cut = 10 ** max(len(str(n)) - 3, 0)
    kept, (scale, unit) = n // cut * cut, (1e6, "M") if n >= 1e6 else (1e3, "k")
    decimals = max(3 - len(str(int(kept // scale))), 0)
    shown = f"{kept / scale:,.{decimals}f}"
    return (shown.rstrip("0").rstrip(".") if decimals else shown) + f" {unit}"


def measure_pace(model: Transformer | Ensemble, cfg: TrainConfig, train: Encoded,
                 device: torch.device) -> tuple[float, float]:
    """Target tokens per second of training ``model`` on the first batches of ``train``, and the share of
    its cores the process had meanwhile (on CPU, :func:`clock.cpu_share`: under ``clock.BUSY_SHARE``,
    other processes held the cores, and the pace is a busy machine's; 1 on a GPU).

    ``model`` must be a throwaway copy: the probe makes real updates (the run's own training
    step: loss, backward, clipping, AdamW, autocast) with their dropout drawn from a forked random
    generator, so neither the run's weights nor its random state move. One update is not timed
    (kernel selection, the allocator's first blocks), then updates are timed for ``PROBE_SECONDS``;
    the pace is the median of theirs, so a busy moment slows one sample, not the figure.
    """
    with forked_random(device), tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(model, cfg, train, lambda: {}, ("loss", False), Path(scratch), device)
        model.train()
        updates = trainer.epoch_updates(train.lengths())
        if not updates:
            raise TaskformerError("no training batches to measure the pace on")
        counts: list[int] = []
        seconds: list[float] = []
        least = PROBE_UPDATES[0] if device.type == "cpu" else PROBE_GPU_UPDATES
        started, cpu = time.perf_counter(), time.process_time()
        for number, group in enumerate(itertools.cycle(updates)):  # a tiny train split is gone over again
            micro = [(src.to(device), tgt.to(device)) for src, tgt in (collate(train, b) for b in group)]
            begun = time.perf_counter()
            _, count = trainer._step(micro)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if number == 0:
                started, cpu = time.perf_counter(), time.process_time()
                continue
            counts.append(count)
            seconds.append(time.perf_counter() - begun)
            spent = time.perf_counter() - started
            if len(counts) >= PROBE_UPDATES[1] or (len(counts) >= least and spent >= PROBE_SECONDS):
                break
        # on a GPU the processor mostly waits for it: its share says nothing of other processes
        share = 1.0 if device.type != "cpu" else clock.cpu_share(time.process_time() - cpu,
                                                                 time.perf_counter() - started, torch.get_num_threads())
    return clock.median_pace(counts, seconds), share
