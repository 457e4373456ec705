"""A time limit's one owner: the clock that every time decision of a run asks.

A time limit promises the user's minutes: the whole command (its start, training, validation and
the final evaluation) ends by then. :class:`Clock` holds that promise in seconds: when the command
began, the limit, the seconds left, what is kept back from training and why (the final evaluation
and a margin on its estimate), and the pace in target tokens per second, measured before training
and over the run. The recipe choice (core/budget.py), the reserve, the cool-down and the stop
(core/engine.py) all read it, so none of them does arithmetic of its own with the time.

Estimates come from several samples, so a busy second does not decide a run: the pace probe's is
the median of its updates' paces, and the engine re-measures the rate of updates as it trains
(:func:`updates_per_second`) and lets the cool-down follow it. The time source is injectable
(``now``): tests drive slow and fast stretches without waiting for them.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# The final evaluation's estimate is kept back with this share more: it is measured on a few
# examples, and the report and outputs are written after it.
RESERVE_MARGIN = 0.25
# A plan of fewer updates than this learns little (a translation model writes "A a a a"): such a
# plan is said before training, and a limit that buys none is refused with the minimum for this many.
FEW_UPDATES = 100
# The rate of updates over the run is measured on the last this many updates (validations included,
# since they come out of the same time), so the cool-down follows a change of pace within them.
RATE_WINDOW = 32
# A run that used less than this share of its limit says why.
WELL_USED = 0.9


def median_pace(tokens: Sequence[int], seconds: Sequence[float]) -> float:
    """Target tokens/s as the median of each sample's pace: one busy update cannot decide it."""
    return statistics.median(n / max(s, 1e-9) for n, s in zip(tokens, seconds, strict=True))


def updates_per_second(marks: Sequence[Sequence[float]]) -> float | None:
    """The rate of updates over ``marks``, ``(seconds of training, updates)`` after each update, oldest
    first; None before two marks."""
    if len(marks) < 2:
        return None
    (t0, s0), (t1, s1) = marks[0], marks[-1]
    return (s1 - s0) / max(t1 - t0, 1e-9)


def reserve_for(seconds: float) -> float:
    """What is kept back for a final evaluation estimated at ``seconds``: the estimate and its margin."""
    return seconds * (1 + RESERVE_MARGIN)


def minutes_up(seconds: float) -> float:
    """``seconds`` as minutes a person types, rounded up to the half minute."""
    return max(math.ceil(seconds / 30) / 2, 0.5)


@dataclass
class Clock:
    """A command's time limit (``limit`` seconds; None: no limit) counted from ``started``.

    ``spent`` is the training time of earlier attempts (a resumed run counts it as used); ``kept``
    the seconds kept back from training, by why; ``start_pace`` the target tokens/s measured before
    training. ``now`` is the time source, ``time.monotonic`` unless a test drives it."""

    limit: float | None
    started: float | None = None
    now: Callable[[], float] = time.monotonic
    spent: float = 0.0
    kept: dict[str, float] = field(default_factory=dict)
    start_pace: float | None = None

    def __post_init__(self) -> None:
        if self.started is None:
            self.started = self.now()

    @classmethod
    def minutes(cls, minutes: float | None, started: float | None = None,
                now: Callable[[], float] = time.monotonic) -> Clock:
        """The clock of ``--time-limit MINUTES``, the command line's unit."""
        return cls(minutes * 60 if minutes else None, started, now)

    def elapsed(self) -> float:
        """Seconds used so far, earlier attempts included."""
        assert self.started is not None
        return self.spent + self.now() - self.started

    def left(self) -> float | None:
        """Seconds of the limit not yet used; None without a limit."""
        return None if self.limit is None else self.limit - self.elapsed()

    def reserve(self) -> float:
        """Seconds kept back from training, all reasons together."""
        return sum(self.kept.values())

    def for_training(self) -> float | None:
        """Seconds left for training and validation: what is left less what is kept back."""
        left = self.left()
        return None if left is None else left - self.reserve()

    def keep_final(self, seconds: float) -> None:
        """Keep back a final evaluation estimated at ``seconds`` (with the last validation, where one
        follows the last update), and the margin on that estimate."""
        self.kept = {"final evaluation": seconds, "margin": reserve_for(seconds) - seconds}

    def updates_left(self, marks: Sequence[Sequence[float]]) -> int:
        """The updates left for training at the rate of ``marks`` (see :func:`updates_per_second`); -1
        where it is not known: no limit, or fewer than two marks."""
        seconds, rate = self.for_training(), updates_per_second(marks)
        return -1 if seconds is None or rate is None else max(math.floor(rate * seconds), 0)

    def minimum(self, training: float) -> float:
        """The least limit, in minutes, that leaves ``training`` seconds after what is used and kept."""
        return minutes_up(self.elapsed() + self.reserve() + training)

    def since_start(self) -> float:
        """Seconds since this command began (a resumed run's earlier attempts not counted)."""
        assert self.started is not None
        return self.now() - self.started

    def account(self, tokens: int, trained: float, stopped: str, final: float) -> dict:
        """How the run used its limit, for result.json and the report: the pace before training and
        over the run (``tokens`` in ``trained`` seconds), the share of the limit used and, where it is
        under ``WELL_USED``, why: training ``stopped`` so, and the final evaluation took ``final`` s
        of what was kept back for it."""
        record: dict = {"start_pace": round(self.start_pace) if self.start_pace else None,
                        "run_pace": round(tokens / max(trained, 1e-9))}
        if self.limit:
            used = self.elapsed()
            record["used"] = round(used / self.limit, 3)
            if used < WELL_USED * self.limit:
                busy = ""
                if self.start_pace and self.start_pace < 0.7 * record["run_pace"]:
                    busy = (f"; the machine was busier when the pace was probed ({self.start_pace:,.0f} tok/s) "
                            f"than over the run ({record['run_pace']:,} tok/s)")
                record["short_of_limit"] = (f"used {used:,.0f} s of {self.limit:,.0f}: training stopped because "
                                            f"{stopped}, and the final evaluation took {final:,.0f} s of the "
                                            f"{self.reserve():,.0f} s kept for it{busy}")
        return record


def fall(cooldown: Sequence[float], step: int) -> tuple[int, float]:
    """Where a cool-down ``[start, length, share, origin]`` leaves update ``step``: the step whose
    scheduled rate it falls from (``origin``, where it first began) and the share of that rate it keeps.
    From update ``start`` the share falls linearly from ``share`` to zero over ``length`` more updates
    (the last at 1 / (length + 1) of it); before it, the schedule holds."""
    if not cooldown or step < cooldown[0]:
        return step, 1.0
    start, length, share, origin = (*cooldown, 1.0, cooldown[0])[:4]  # an older checkpoint's [start, length]
    return int(origin), share * max(start + length - step + 1, 0) / (length + 1)


def replanned(cooldown: Sequence[float], step: int, updates: int, total: int = 0) -> list[float]:
    """``cooldown``, after update ``step``, spread anew over the ``updates`` the clock now buys (and no
    further than a step budget ``total``): the fall goes on from the share it has reached, linearly to
    zero after them. Unchanged where it already ends there."""
    length = max(updates - 1, 1)
    if total:
        length = min(length, max(total - step - 1, 1))
    start, old, *_ = cooldown
    if step + 1 + length == start + old:
        return list(cooldown)
    origin = cooldown[3] if len(cooldown) > 3 else start
    return [step + 1, length, fall(cooldown, step + 1)[1], origin]
