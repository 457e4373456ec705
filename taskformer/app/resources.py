"""What a run needs from the machine: the device, torch's threads, glibc's allocator, and the
memory a model and its data need, checked before any of it is made."""
from __future__ import annotations

import ctypes
import functools
import math
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from taskformer.core import config as C
from taskformer.core import variants
from taskformer.core.config import RunConfig
from taskformer.core.errors import TaskformerError
from taskformer.core.model import Transformer
from taskformer.plugins.hookspecs import Task


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def checked_processes(nproc: int) -> int:
    """``--nproc``, refused beyond the cores this process may use on a machine without GPUs (each
    training process needs a core of its own; gloo's ranks time out waiting on each other otherwise)."""
    if nproc > 1 and not torch.cuda.is_available() and nproc > usable_cores():
        raise TaskformerError(f"--nproc {nproc}: this process may use {usable_cores()} core(s), and each training "
                              f"process needs one; give at most --nproc {usable_cores()}")
    return nproc


def checked_threads(threads: int) -> int:
    """A command's ``--threads``, refused beyond the cores this process may use (OpenMP crashes far
    beyond the machine's cores)."""
    if threads > usable_cores():
        raise TaskformerError(f"--threads {threads}: this process may use {usable_cores()} core(s); "
                              "give at most that many")
    return threads


def use_threads(config: RunConfig) -> None:
    """``train.threads``: torch's intra-op threads for training and decoding (0 keeps torch's choice);
    and freed memory kept for reuse (see ``keep_freed_memory``)."""
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    keep_freed_memory()


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt() parameter numbers (malloc.h)


@functools.cache
def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for the next allocation; True where it was asked.

    torch's CPU tensors come from malloc, and glibc maps a large block (above 32 MB at most; the logits
    of a 4k-token batch over a 10k vocabulary are 160 MB) fresh from the kernel and unmaps it on free,
    so every update paid a page fault per 4 kB it touched: 86k faults an update of translate-de-en.
    Serving large blocks from the heap and never trimming it keeps those pages mapped: 1.15x the
    updates per hour for 5% more peak memory (bench/race/allocator.py, docs/benchmarks.md). Other C
    libraries and systems are left as they are (PyTorch's CPU tuning guide suggests jemalloc or
    tcmalloc there).
    """
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


BYTES_PER_PARAMETER = 16  # to train in fp32: the weight, its gradient and Adam's two moments (4 to load it)
BYTES_PER_TOKEN = 150  # a token of data in memory: its text, its id and the lists holding them (~120 on copy)
BYTES_PER_ENTRY = 200  # a vocabulary entry: its string here and in the tokenizer (~190 on copy)


def available_memory() -> int | None:
    """Bytes of memory a new run can use: Linux's MemAvailable (it counts the caches the kernel can
    drop), else the free pages POSIX reports; None where neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


BYTES_PER_DATA_BYTE = 7  # preparing a data set: its text as Python strings and rows, the tokenizer's work
# (measured: 280 MB above a warm start's for the 40 MB of 300k Multi30k pairs, docs/benchmarks.md)
GZIP_RATIO = 4  # the text a byte of a .gz file holds, about


def check_data_memory(data_dir: str | Path, text_bytes: int) -> None:
    """Refuse, before reading a byte, data files whose preparation cannot fit in the memory
    available: a task's data hook holds the rows as Python strings while the tokenizer trains
    (the encoded ids, flat arrays, take far less). ``text_bytes`` counts a ``.gz`` file at
    :data:`GZIP_RATIO` times its size."""
    available = available_memory()
    need = text_bytes * BYTES_PER_DATA_BYTE
    if available is None or need <= available:
        return
    gib = 2**30
    raise TaskformerError(f"--data-dir {data_dir}: preparing its {text_bytes / 1e9:,.1f} GB of text needs about "
                          f"{need / gib:,.1f} GiB of memory, but {available / gib:,.1f} GiB is available; use "
                          "fewer or smaller files, or a task option that reads fewer rows")


def check_memory(task: Task, config: RunConfig, vocab_size: int, num_classes: int = 0, tokens: int = 0,
                 training: bool = True) -> None:
    """Refuse a model and data that cannot fit in the memory available, before any of it is made,
    instead of letting the kernel kill the run minutes later.

    Parameters are counted on torch's meta device (shapes without storage). ``tokens`` is data still
    to be made: a task that makes its data from its options states its size with the options'
    ``footprint()``. The settings raised above the task's defaults are named, as one of them is
    nearly always at fault.
    """
    available = available_memory()
    if available is None:
        return
    try:
        with torch.device("meta"):
            net = Transformer(replace(config.model, vocab_size=vocab_size, num_classes=num_classes))
            params: float = config.model.members * net.num_parameters()
            # buffers are not trained but take memory: the positional table is model.max_len x model.d_model
            buffers: float = config.model.members * sum(b.numel() for b in net.buffers())
    except RuntimeError:  # sizes whose product overflows 64 bits: torch cannot even describe the tensors
        params = buffers = math.inf
    model = params * (BYTES_PER_PARAMETER if training else 4) + buffers * 4
    data = tokens * BYTES_PER_TOKEN + (vocab_size * BYTES_PER_ENTRY if tokens else 0)
    if model + data <= available:
        return
    defaults, settings = C.defaults(task), config.to_dict()
    raised = [f"{s}.{k}={v}" for s in ("model", "data") for k, v in settings[s].items()
              if type(v) in (int, float) and type(defaults[s].get(k)) in (int, float) and v > defaults[s][k]]
    gib = 2**30
    need = (f"about {(model + data) / gib:,.1f} GiB ({params:,} parameters {'to train' if training else 'to load'} and "
            f"{buffers:,} fixed numbers: "
            f"{model / gib:,.1f} GiB{f'; its data: {data / gib:,.1f} GiB' if data else ''})"
            if math.isfinite(params) else "more than 64-bit sizes can count")
    raise TaskformerError(f"config: this run does not fit in memory: it needs {need}, but {available / gib:,.1f} GiB "
                          f"is available; lower {', '.join(raised) or 'the model or data sizes'}")


def check_search_memory(config: RunConfig) -> None:
    """Refuse a beam search whose key/value cache cannot fit, before it starts: each of beam x
    decode.batch_size hypotheses keeps a key and a value per decoder layer and output position
    (at most model.max_len), in fp32, once for each ensemble member. An upper bound: a batch may hold
    fewer inputs, outputs end sooner."""
    d, m = config.decode, config.model
    if d.strategy != "beam" or not variants.of(m.variant).decoder or (available := available_memory()) is None:
        return  # a classifier or tagger searches nothing (and a server asks on every batch)
    need = m.members * d.beam * d.batch_size * m.max_len * max(m.dec_layers, 1) * m.d_model * 2 * 4
    if need > available:
        members = f"{m.members} members (model.members) x " if m.members > 1 else ""
        raise TaskformerError(f"decode.beam={d.beam}: the search's key/value cache needs up to {need / 2**30:,.1f} GiB "
                              f"({members}beam x decode.batch_size={d.batch_size} x model.max_len={m.max_len} x "
                              f"{m.dec_layers} layers x d_model {m.d_model}, keys and values), but "
                              f"{available / 2**30:,.1f} GiB is available; lower the beam or decode.batch_size")


def command_started() -> float:
    """``time.monotonic()`` when this ``taskformer`` command started: the process's start (from /proc
    on Linux) where the process is the command, so that a time limit counts the interpreter's and
    torch's start too, which the user waits for as well; now where taskformer runs inside another
    program (a test, a notebook), or /proc cannot say."""
    command = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if command.name != "taskformer" and command.parts[-2:] != ("taskformer", "__main__.py"):
        return time.monotonic()
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        since_boot = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in clock ticks
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.monotonic() - max(uptime - since_boot, 0.0)
    except (OSError, ValueError, IndexError):
        return time.monotonic()
