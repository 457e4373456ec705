"""A time limit's one owner: the clock that every time decision of a run asks.

A time limit promises the user's minutes: the whole command (its start, training, validation and
the final evaluation) ends by then. :class:`Clock` holds that promise in seconds: when the command
began, the limit, the seconds left, what is kept back from training and why (the last validation,
the final evaluation, a margin on their estimate and the report after them), and the pace, measured before training and
over the run. The recipe choice (core/budget.py), the reserve, the learning rate's decay and the
stop (core/engine.py) all read it, so none of them does arithmetic of its own with the time.

Two rules make a run use its minutes whatever the machine does around it:

- **The decay follows the clock, not a count.** Over the last ``train.cooldown`` share of the
  training time the learning rate keeps the share :func:`decay_share` of its scheduled value: the
  seconds left over the decay's length, asked after every update. However fast or slow the updates
  were before, the rate reaches zero as the time for training runs out, and not before.
- **Estimates follow the machine.** The final evaluation is timed before training, and again after
  each validation and where the cool-down begins (:meth:`Clock.measured`), while the machine trains at
  some pace; if it later trains faster (a busy stretch, then an idle machine), the estimate is scaled
  by the same factor: decoding and training share the cores (:meth:`Clock.observe`). A slower pace
  grows it only in the last stretch, where the end will find the machine as it is now.
- **A busy start is not the budget.** Figures timed while other processes held the cores (the share
  of its cores this process had, :func:`cpu_share`, is under ``BUSY_SHARE``) are kept at what they
  would take with all of them: a run is refused only if even those leave no time to train, and what
  is kept back follows the pace of the updates once it is measured again on the free machine.

The time source is injectable (``now``): tests drive slow and fast stretches without waiting.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# The estimates are kept back with this share more: they are measured on a few examples.
RESERVE_MARGIN = 0.25
# The outputs, result.json and the report (its plots and HTML) are written after the final evaluation, and
# the interpreter then exits: work no estimate times, kept back as these seconds (docs/results.md has what
# it took). A margin on the estimates alone covered it only while they ran long.
REPORT_SECONDS = 3.0
# A plan of fewer updates than this learns little (a translation model writes "A a a a"): such a
# plan is said before training, and a limit that buys none is refused with the minimum for this many.
FEW_UPDATES = 100
# The seconds an update takes are followed as an exponential average with this weight on the newest:
# about the last ten updates count, so a change of pace shows within them and one slow update does not.
PACE_WEIGHT = 0.1
# A run that used less than this share of its limit says why.
WELL_USED = 0.9
# A process that had less than this share of its cores' time while it computed on all of them shared
# the machine: an idle one has nearly all of it (torch's threads work, or wait spinning).
BUSY_SHARE = 0.7


def cpu_share(cpu: float, wall: float, threads: int) -> float:
    """The share of ``threads`` cores a process had over ``wall`` seconds in which it used ``cpu``
    seconds of processor time (all its threads), at most 1."""
    return min(cpu / max(wall * threads, 1e-9), 1.0)


def busy_share(share: float) -> float:
    """What figures timed while a process had ``share`` of its cores are scaled by to be an idle
    machine's: ``share`` on a busy one (under ``BUSY_SHARE``), else 1 (an idle machine's processor time
    is not all of its cores' either: a thread waits for memory or for Python's)."""
    return share if share < BUSY_SHARE else 1.0


def median_pace(tokens: Sequence[int], seconds: Sequence[float]) -> float:
    """Target tokens/s as the median of each sample's pace: one busy update cannot decide it."""
    return statistics.median(n / max(s, 1e-9) for n, s in zip(tokens, seconds, strict=True))


def decay_share(left: float, length: float) -> float:
    """The share of the scheduled learning rate kept with ``left`` (seconds or updates) of a linear
    decay of ``length`` to go: 1 before the decay, falling to 0 at its end."""
    return min(max(left / length, 0.0), 1.0) if length > 0 else float(left > 0)


def step_share(step: int, total: int, fraction: float) -> float:
    """The share :func:`decay_share` after update ``step`` of ``total`` planned ones (0: none planned, no
    decay by a count) whose last ``fraction`` decay."""
    if not (total and fraction):
        return 1.0
    return decay_share(total - step, total - math.ceil((1 - fraction) * total))


def reserve_for(seconds: float) -> float:
    """What is kept back for work estimated at ``seconds``: the estimate, its margin and the report after it."""
    return seconds * (1 + RESERVE_MARGIN) + REPORT_SECONDS


def minutes_up(seconds: float) -> float:
    """``seconds`` as minutes a person types, rounded up to the half minute."""
    return max(math.ceil(seconds / 30) / 2, 0.5)


@dataclass
class Clock:
    """A command's time limit (``limit`` seconds; None: no limit) counted from ``started``.

    ``spent`` is the training time of earlier attempts (a resumed run counts it as used). What is
    kept back is ``estimates`` (seconds by why: the last validation, the final evaluation) timed
    while an update took ``timed_at`` seconds, scaled to ``per_update``, the seconds an update takes
    now (see :meth:`observe`). ``start_pace`` is the target tokens/s measured before training. ``now``
    is the time source, ``time.monotonic`` unless a test drives it."""

    limit: float | None
    started: float | None = None
    now: Callable[[], float] = time.monotonic
    spent: float = 0.0
    start_share: float | None = None  # the share of its cores the process had while the pace was probed
    estimates: dict[str, float] = field(default_factory=dict)
    timed_at: float | None = None
    per_update: float | None = None
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

    # -- what is kept back -----------------------------------------------------------------------
    def keep(self, final: float, last_validation: float = 0.0, per_update: float | None = None,
             share: float = 1.0) -> None:
        """Keep back a final evaluation and a last validation estimated at these seconds, timed while an
        update took ``per_update`` seconds (None: the pace now, or no scaling where none is known) and
        the process had ``share`` of its cores: all are kept at what they take with all of them (a busy
        start's figures would otherwise refuse the run, or stop it after its first updates). Figures timed
        on a busy machine are not scaled by the pace until one is measured again (:meth:`measured`): a
        busy machine slows training's updates several times more than its share of the cores (threads
        wait for each other), and decoding about as much as that share, so the pace's speed-up when it
        frees up would shrink them to a fraction of what the end takes."""
        self.estimates = {"last validation": last_validation * share, "final evaluation": final * share}
        timed = per_update or self.per_update
        self.timed_at = timed if timed and share >= 1 else None

    def measured(self, why: str, seconds: float) -> None:
        """``why`` (the last validation, the final evaluation) was timed again just now at ``seconds``, at
        the pace now with all the cores: kept at the pace the estimates were timed at, so that
        :meth:`scale` brings it back and follows the pace from there (the first measure after a busy
        start's figures sets the pace they all follow)."""
        self.timed_at = self.timed_at or self.per_update
        then = self.timed_at / self.per_update if self.timed_at and self.per_update else 1.0
        self.estimates[why] = seconds * then

    def busy(self) -> bool:
        """Whether the machine was busy while the pace was probed (see ``BUSY_SHARE``)."""
        return self.start_share is not None and self.start_share < BUSY_SHARE

    def scale(self) -> float:
        """How many times longer the estimates take now than when they were timed: the ratio of the
        seconds an update takes now to those it took then (1 until both are known). A faster machine
        shrinks what is kept back. A slower one grows it only in the last stretch (:meth:`last_stretch`):
        earlier, a busy stretch would stop the run for an evaluation it may well do at full speed, but
        near the end the machine the evaluation will find is the one training now."""
        ratio = self.per_update / self.timed_at if self.per_update and self.timed_at else 1.0
        return ratio if ratio <= 1.0 or self.last_stretch() else 1.0

    def last_stretch(self) -> bool:
        """Whether the training time left is under what is kept back (at the pace it was timed at):
        the end is as near as the evaluation it keeps back is long."""
        left, kept = self.left(), reserve_for(sum(self.estimates.values()))
        return left is not None and left - kept < kept

    @property
    def kept(self) -> dict[str, float]:
        """The seconds kept back from training, by why: the estimates as the machine goes now, their margin
        and the report."""
        kept = {why: seconds * self.scale() for why, seconds in self.estimates.items() if seconds}
        total = sum(kept.values())
        margin = reserve_for(total) - total - REPORT_SECONDS
        return {**kept, "margin": margin, "the report": REPORT_SECONDS} if kept else {}

    def reserve(self) -> float:
        """Seconds kept back from training, all reasons together."""
        return sum(self.kept.values())

    def for_training(self) -> float | None:
        """Seconds left for training and validation: what is left less what is kept back."""
        left = self.left()
        return None if left is None else left - self.reserve()

    def observe(self, seconds: float) -> None:
        """An update took ``seconds``: follow the pace (an average over about the last ten updates). The
        average starts from the pace the estimates were timed at, where known: the first update carries
        one-time costs, and alone it would scale what is kept back by them."""
        before = self.per_update or self.timed_at
        self.per_update = seconds if before is None else PACE_WEIGHT * seconds + (1 - PACE_WEIGHT) * before

    def state(self) -> dict:
        """What a checkpoint keeps of the clock, so that a resumed run keeps back what this one did."""
        return {"estimates": dict(self.estimates), "timed_at": self.timed_at, "per_update": self.per_update}

    def restore(self, saved: dict) -> None:
        """Take back :meth:`state` (an empty one, from an older checkpoint, changes nothing)."""
        if saved.get("estimates"):
            self.estimates, self.timed_at = dict(saved["estimates"]), saved.get("timed_at")
        self.per_update = saved.get("per_update") or self.per_update

    # -- the decay and the plan -------------------------------------------------------------------
    def updates_in_budget(self, made: int) -> float:
        """The updates of the whole budget after ``made`` of them: those and those the training time left
        buys at the faster of the pace now and the one the estimates were timed at with all the cores (a
        busy stretch is not taken to last). A warm-up that is a share of them (``train.warmup_share``, on
        :func:`core.engine.inverse_sqrt`) then spans as many updates, and the decay after it falls with
        the updates as at an even pace, whatever a busy start did to the seconds they took."""
        left = self.for_training()
        assert left is not None, "a clock without a limit has no schedule by the time"
        paces = [seconds for seconds in (self.per_update, self.timed_at) if seconds]
        return made + (max(left, 0.0) / min(paces) if paces else 0.0)

    def decay(self, trained: float, fraction: float, begun: float | None = None) -> float:
        """The share of the scheduled learning rate the next update keeps after ``trained`` seconds of
        training: the rate falls linearly to zero over the last ``fraction`` of the training time of
        the whole budget (``trained`` and what is left for training), or from ``begun`` seconds where a
        decay over all the time after the warm-up began then. Asked after every update, it ends at the
        end of the time whatever the pace was before."""
        left = self.for_training()
        assert left is not None, "a clock without a limit has no decay"
        length = trained + left - begun if begun is not None else fraction * (trained + left)
        return decay_share(left, length)

    def minimum(self, training: float) -> float:
        """The least limit, in minutes, that leaves ``training`` seconds after what is used and kept."""
        return minutes_up(self.elapsed() + self.reserve() + training)

    def since_start(self) -> float:
        """Seconds since this command began (a resumed run's earlier attempts not counted)."""
        assert self.started is not None
        return self.now() - self.started

    def account(self, tokens: int, trained: float, stopped: str, final: float) -> dict:
        """How the run used its limit, for result.json and the report: the pace before training and
        over the run (``tokens`` in ``trained`` seconds), the final evaluation's estimate at the end and
        the ``final`` seconds it took, the share of the limit used and, where it is under ``WELL_USED``
        or over the limit, why: training ``stopped`` so, and the final evaluation took what it took of
        what was kept."""
        record: dict = {"start_pace": round(self.start_pace) if self.start_pace else None,
                        "run_pace": round(tokens / max(trained, 1e-9))}
        if self.start_share is not None:
            record["start_share"] = round(self.start_share, 2)
        if "final evaluation" in self.estimates:
            record["final_estimate"] = round(self.kept.get("final evaluation", 0.0), 1)
            record["final_seconds"] = round(final, 1)
        if self.limit:
            used = self.elapsed()
            record["used"] = round(used / self.limit, 3)
            if not WELL_USED * self.limit <= used <= self.limit:
                busy = ""
                if self.busy() or (self.start_pace and self.start_pace < 0.7 * record["run_pace"]):
                    busy = (f"; the machine was busier when the pace was probed ({self.start_pace:,.0f} tok/s) "
                            f"than over the run ({record['run_pace']:,} tok/s)")
                record["short_of_limit" if used < self.limit else "over_limit"] = (
                    f"used {used:,.0f} s of {self.limit:,.0f}: training stopped because {stopped}, and the final "
                    f"evaluation took {final:,.0f} s of the {self.reserve():,.0f} s kept for it{busy}")
        return record
