"""torch's threads on a shared machine: as many as the cores other processes leave free.

torch's intra-op threads wait for each other at every operation (OpenMP barriers and spin-waits).
Where other processes keep the cores busy, each thread gets part of a core, and the threads lose
far more than their share: on 2 cores with two other processes spinning, a training update took
3 to 4.6 times as long as alone while the process had half of its cores' time; one thread, which
waits for no other, did several times the updates of two in the same conditions (docs/results.md).

So while a run trains, :class:`Threads` looks every ``EVERY`` seconds at how many cores the other
processes used since its last look -- the whole machine's busy time (``/proc/stat``) less this
process's own processor time -- and sets torch's threads to the cores they leave free: at least
one, at most the threads the run started with. A core counts as taken once the others use more
than ``TAKEN`` of it, and as free again only once they use less than ``FREED`` of it, so a load
near the line does not make the count flap; when the others stop, the threads come back.

Where the machine's figures are not this process's (no ``/proc/stat``, as on macOS and Windows; a
CPU affinity mask or a cgroup quota narrower than the machine the file counts, as in a container)
:func:`follower` gives nothing and the threads stay as they are.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

PROC_STAT = Path("/proc/stat")
CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2's quota of the processes it holds ("max" or "QUOTA PERIOD")
EVERY = 5.0  # seconds of training between two looks at the machine
SHORTEST = 2.0  # the least wall time a look reads (the machine's counters tick a hundred times a second)
TAKEN = 0.5  # the share of a core the others use from which the core is theirs: a thread is dropped
FREED = 0.25  # the share below which it is free again: a thread comes back


@dataclass(frozen=True)
class Usage:
    """The machine's processor time so far: the wall ``seconds`` its counters cover (all cores' ticks
    over the cores), the core-seconds every process used (``busy``) and those of this process (``own``)."""

    seconds: float
    busy: float
    own: float

    def others(self, before: Usage) -> float:
        """The cores other processes used, on average, since ``before``."""
        return max(self.busy - before.busy - (self.own - before.own), 0.0) / max(self.seconds - before.seconds, 1e-9)


def parse_stat(text: str) -> tuple[int, int, int] | None:
    """``/proc/stat``'s cores (its ``cpuN`` lines) and the ticks of its ``cpu`` line, all and idle (idle
    and waiting for I/O); None where it has no such line. A guest's time is counted in the user time
    already, so the fields after ``steal`` are left out."""
    lines = text.splitlines()
    total = next((line.split()[1:] for line in lines if line.split()[:1] == ["cpu"]), None)
    cores = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    try:
        ticks = [int(n) for n in total[:8]] if total else []
    except ValueError:
        return None
    if len(ticks) < 5 or not cores:
        return None
    return cores, sum(ticks), ticks[3] + ticks[4]


def machine_usage(path: Path = PROC_STAT) -> Usage | None:
    """The machine's :class:`Usage` now, from ``path`` and this process's own times; None where unreadable."""
    try:
        parsed = parse_stat(path.read_text(encoding="ascii"))
    except (OSError, ValueError):
        return None
    if parsed is None:
        return None
    cores, total, idle = parsed
    tick = os.sysconf("SC_CLK_TCK")
    own = os.times()
    return Usage(total / cores / tick, (total - idle) / tick, own.user + own.system)


def cores_here(path: Path = PROC_STAT, quota: Path = CPU_MAX) -> int | None:
    """The cores the machine's figures count, where they are this process's: None without ``/proc/stat``,
    or where this process may use fewer cores than it counts (its affinity mask, a cgroup's quota)."""
    try:
        parsed = parse_stat(path.read_text(encoding="ascii"))
    except (OSError, ValueError):
        return None
    if parsed is None or not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) != parsed[0]:
        return None
    try:
        limit, period = quota.read_text(encoding="ascii").split()[:2]
        if limit != "max" and int(limit) < int(period) * parsed[0]:
            return None
    except (OSError, ValueError):  # no cgroup v2 file: no quota read
        pass
    return parsed[0]


def wanted(threads: int, most: int, cores: int, others: float) -> int:
    """The threads to train on with ``threads`` now, ``most`` at the start, on ``cores`` cores of which
    the other processes used ``others``: one fewer for each core they took (over ``TAKEN`` of it), and
    back only for each core they freed (under ``FREED``)."""
    def leave(share: float) -> int:
        return min(max(cores - math.ceil(others - share), 1), most)
    fewer, more = leave(TAKEN), leave(FREED)
    return fewer if fewer < threads else max(more, threads)


@dataclass
class Threads:
    """torch's threads, following the cores the other processes use (see the module's docstring).

    ``usage`` reads the machine (:func:`machine_usage`; a test gives its own); ``most`` is the count the
    run started with. :meth:`follow` is asked after every update and looks every ``every`` seconds of
    training; ``changes`` records each change it made."""

    cores: int
    usage: Callable[[], Usage | None] = machine_usage
    most: int = field(default_factory=torch.get_num_threads)
    every: float = EVERY
    changes: list[dict] = field(default_factory=list)
    looked: float = 0.0  # the training seconds of the last look
    last: Usage | None = None

    def __post_init__(self) -> None:
        self.last = self.usage()

    def follow(self, seconds: float, step: int) -> dict | None:
        """After update ``step``, ``seconds`` into training: the change of threads made, if one was."""
        if seconds - self.looked < self.every:
            return None
        now = self.usage()
        if now is None or self.last is None or now.seconds - self.last.seconds < SHORTEST:
            return None  # the window goes on: the next look reads it whole
        others, threads = now.others(self.last), torch.get_num_threads()
        self.looked, self.last = seconds, now
        to = wanted(threads, self.most, self.cores, others)
        if to == threads:
            return None
        torch.set_num_threads(to)
        change = {"step": step, "seconds": round(seconds, 1), "from": threads, "to": to, "others": round(others, 2),
                  "cores": self.cores}
        self.changes.append(change)
        return change

    def restore(self) -> None:
        """The threads the run started with, for what follows training (its final evaluation)."""
        torch.set_num_threads(self.most)


def follower(device: torch.device, processes: int) -> Threads | None:
    """A :class:`Threads` for training on ``device`` in ``processes`` processes, where it applies: one
    process on the CPU (a GPU's work does not wait on the CPU's threads, and each of several processes
    has its own threads, shared out at their start), on a machine whose figures are this process's."""
    cores = cores_here() if device.type == "cpu" and processes == 1 else None
    if cores is None or torch.get_num_threads() < 2:
        return None
    return Threads(cores, machine_usage, every=EVERY)
