"""Which precision to train and decode in: bf16 where the hardware runs it natively, fp32 elsewhere.

bf16 autocast halves memory traffic and, on hardware with bf16 matrix units, runs the matmuls several
times faster. Where those units are missing PyTorch *emulates* bf16 and a training step becomes many
times slower (20x was seen on an AVX2-only CPU). So ``train.bf16 = "auto"`` (the default) asks the
hardware, never a CPU's name:

* CUDA: ``torch.cuda.is_bf16_supported()``.
* CPU: the instruction set must have bf16 (AVX-512 BF16 or AMX, as torch reports it), oneDNN must be
  allowed to use it (``ONEDNN_MAX_CPU_ISA`` can cap it, which also lets tests force the slow path),
  and at least one of the probe's rounds must find a bf16 matmul clearly faster than fp32
  (``PROBE_MIN_SPEEDUP``). A busy moment slows one round, not all of them, so rounds that disagree
  leave the decision to the CPU's flags; only a CPU whose bf16 is slow in every round (emulated
  behind the flags) falls back to fp32.

The answer is cached per process, and a run records it when it starts, so that a resumed run trains in
the precision it began with (:func:`pin`) whatever a probe on a busy machine would say then.
``true``/``false`` force the choice; forcing bf16 where it is emulated warns once.
"""
from __future__ import annotations

import functools
import time
import warnings
from contextlib import nullcontext

import torch

from taskformer.core.train_config import bf16_setting

PROBE_MIN_SPEEDUP = 1.3  # native bf16 matmuls measured 1.5x-5x fp32; emulated ones 0.3x-0.8x
PROBE_ROUNDS = 3  # rounds of the probe, each timing fp32 and bf16 side by side; the best round counts

_pinned: dict[str, tuple[bool, str]] = {}  # device type -> a decision recorded by the run (see pin)


def _matmul_seconds(dtype: torch.dtype, reps: int = 5) -> float:
    """Best of ``reps`` (256 x 1024) @ (1024 x 1024) products: the shape of a small model's projections."""
    a, w = torch.randn(256, 1024).to(dtype), torch.randn(1024, 1024).to(dtype)
    torch.nn.functional.linear(a, w)  # first call pays for kernel selection
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.nn.functional.linear(a, w)
        best = min(best, time.perf_counter() - start)
    return best


def pin(device_type: str, native: bool, why: str) -> None:
    """Use a decision recorded earlier (by the run being resumed) instead of probing again."""
    _pinned[device_type] = (native, why)


def unpin() -> None:
    """Probe again: a new run in a process that resumed another decides for itself (and records so)."""
    _pinned.clear()


def bf16_native(device_type: str) -> tuple[bool, str]:
    """Whether bf16 runs natively (and faster) on this kind of device, and why in a few words."""
    return _pinned.get(device_type) or _probe(device_type)


@functools.cache
def _probe(device_type: str) -> tuple[bool, str]:
    if device_type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, f"{torch.cuda.get_device_name()} {'supports' if ok else 'lacks'} bf16"
    if device_type != "cpu":
        return False, f"no bf16 check for {device_type} devices"
    units = [name for name, has in (("AMX", torch.cpu._is_amx_tile_supported()),
                                    ("AVX-512 BF16", torch.cpu._is_avx512_bf16_supported())) if has]
    if not units:
        return False, f"no bf16 instructions ({torch.backends.cpu.get_cpu_capability()} CPU)"
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False, f"{units[0]} capped by ONEDNN_MAX_CPU_ISA"
    with torch.no_grad():
        speedup = max(_matmul_seconds(torch.float32) / _matmul_seconds(torch.bfloat16) for _ in range(PROBE_ROUNDS))
    if speedup < PROBE_MIN_SPEEDUP:
        return False, f"{units[0]}, but bf16 matmul at best {speedup:.1f}x fp32 in {PROBE_ROUNDS} rounds"
    return True, f"{units[0]}, bf16 matmul {speedup:.1f}x fp32"


def choose(setting, device: torch.device) -> tuple[bool, str]:
    """Resolve ``train.bf16`` for ``device``: (use bf16, the reason a report can show)."""
    setting = bf16_setting(setting)
    if setting == "false":
        return False, "train.bf16=false"
    native, why = bf16_native(device.type)
    if setting == "true":
        if not native:
            _warn_emulated(why)
        return True, f"train.bf16=true ({why})"
    return native, f"auto: {why}"


def autocast(setting, device: torch.device):
    """bf16 autocast where the ``train.bf16`` setting (auto, true or false) resolves to bf16 on
    ``device``: training, scoring and decoding all run under it."""
    use, _ = choose(setting, device)
    return torch.autocast(device.type, dtype=torch.bfloat16) if use else nullcontext()


def steady_attention(device: torch.device):
    """Attention without cuDNN's kernels on a GPU. cuDNN builds a plan for every new shape (milliseconds
    each, more in a backward pass), and the shapes change at every batch of training (bucketed lengths)
    and every step of a search (the cache grows, ended rows leave): on an H100 a bf16 search spent 6 ms
    in each attention call, 90% of its time (docs/benchmarks.md). FlashAttention, the memory-efficient
    kernel and the plain one need no plan."""
    if device.type != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


@functools.cache
def _warn_emulated(why: str) -> None:
    warnings.warn(f"train.bf16=true but bf16 is not native here ({why}): expect it to be much slower than fp32",
                  stacklevel=3)
