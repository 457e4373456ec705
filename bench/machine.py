"""What every bench script records and how it times: the machine a figure came from, and rounds that
alternate the contenders so that the machine's noise hits them alike (docs/benchmarks.md)."""
from __future__ import annotations

import os
import platform
import re
import statistics
import time
from pathlib import Path

FORCING = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")  # the slow path of another CPU


def cpu_name() -> str:
    """The CPU's model name (a figure in the docs names the CPU it came from)."""
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), flags=re.M)
    except OSError:  # not Linux
        found = None
    return found.group(1).strip() if found else platform.processor() or platform.machine() or "unknown CPU"


def forced_isa() -> dict:
    """The environment variables that force a slower instruction set, as set for this run."""
    return {k: os.environ[k] for k in FORCING if k in os.environ}


def timed(fn, *args) -> float:
    """Seconds that ``fn(*args)`` takes."""
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def alternate(contenders: dict, work, rounds: int) -> dict:
    """Run ``work(name, contender)`` (which returns seconds) for each contender in turn, ``rounds``
    times; the median seconds of each."""
    times: dict = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, c in contenders.items():
            times[name].append(work(name, c))
    return {name: statistics.median(ts) for name, ts in times.items()}
