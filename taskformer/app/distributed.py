"""Multi-process training on torch.distributed: ``taskformer run TASK --nproc N`` or ``torchrun``.

Each rank trains the same model on its own shard of every update's batches under
DistributedDataParallel (gloo on CPU, NCCL on GPUs); rank 0 alone writes checkpoints, metrics and
the report. ``--nproc`` spawns the ranks on this machine; for several machines start
``torchrun ... -m taskformer run TASK --out DIR`` on each (see docs/scaling.md), which sets the
``RANK``/``WORLD_SIZE`` variables this module reads.
"""
from __future__ import annotations

import datetime as dt
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from taskformer.core.errors import TaskformerError

TIMEOUT = dt.timedelta(minutes=10)  # a rank that waits longer than this for the others gives up


def backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def from_environment() -> tuple[int, int] | None:
    """``(rank, world)`` when started by torchrun with more than one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    dist.init_process_group(backend(), timeout=TIMEOUT)  # reads MASTER_ADDR/PORT, RANK, WORLD_SIZE
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return dist.get_rank(), world


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, threads: int, job, kwargs: dict) -> None:
    torch.set_num_threads(threads)  # a spawned rank starts a fresh torch, which would take every core again
    dist.init_process_group(backend(), init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=TIMEOUT)
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    try:
        job(shard=(rank, world), **kwargs)
    except TaskformerError as e:
        print(f"Error: rank {rank}: {e}", file=sys.stderr, flush=True)
        sys.exit(getattr(e, "exit_code", 2))
    finally:
        dist.destroy_process_group()


def launch(nproc: int, job, **kwargs) -> None:
    """Run ``job(shard=(rank, nproc), **kwargs)`` in ``nproc`` processes; the first failure ends them all."""
    gpus = torch.cuda.device_count()
    if gpus and nproc > gpus:  # NCCL refuses two ranks on one device
        raise TaskformerError(f"--nproc {nproc} needs {nproc} GPUs, but {gpus} visible; use --nproc {gpus}, or "
                              "CUDA_VISIBLE_DEVICES= to train on the CPU")
    threads = max(1, torch.get_num_threads() // nproc)  # the cores shared out: ranks with all of them each fight
    try:
        mp.start_processes(_worker, args=(nproc, _free_port(), threads, job, kwargs), nprocs=nproc, join=True,
                           start_method="spawn")
    except mp.ProcessExitedException as e:
        raise TaskformerError(f"training rank {e.error_index} exited with code {e.exit_code}; "
                              "the other ranks were stopped") from None
    except mp.ProcessRaisedException as e:
        last = [line for line in str(e).strip().splitlines() if line.strip()][-1]
        raise TaskformerError(f"a training rank failed ({last}); the other ranks were stopped") from None
