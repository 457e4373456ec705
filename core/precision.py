"""Which precision to train and decode in: bf16 where the hardware runs it natively, fp32 elsewhere.

bf16 autocast halves memory traffic and, on hardware with bf16 matrix units, runs the matmuls several
times faster. Where those units are missing PyTorch *emulates* bf16 and a training step becomes many
times slower (20x was seen on an AVX2-only CPU). So ``train.bf16 = "auto"`` (the default) asks the
hardware, never a CPU's name:

* CUDA: ``torch.cuda.is_bf16_supported()``.
* CPU: the instruction set must have bf16 (AVX-512 BF16 or AMX, as torch reports it), oneDNN must be
  allowed to use it (``ONEDNN_MAX_CPU_ISA`` can cap it, which also lets tests force the slow path),
  and a probe of a few milliseconds must find a bf16 matmul clearly faster than fp32.

The answer is cached per process. ``true``/``false`` force the choice; forcing bf16 where it is emulated
warns once.
"""
from __future__ import annotations

import functools
import time
import warnings

import torch

SETTINGS = ("auto", "true", "false")
PROBE_MIN_SPEEDUP = 1.3  # native bf16 matmuls measured 1.5x-5x fp32; emulated ones 0.3x-0.8x


def normalize(setting) -> str:
    """``train.bf16`` as one of SETTINGS (config files may hold a real boolean)."""
    text = str(setting).strip().lower()
    text = {"1": "true", "yes": "true", "on": "true", "0": "false", "no": "false", "off": "false"}.get(text, text)
    if text not in SETTINGS:
        raise ValueError(f"train.bf16 must be auto, true or false, not {setting!r}")
    return text


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


@functools.lru_cache(maxsize=None)
def bf16_native(device_type: str) -> tuple[bool, str]:
    """Whether bf16 runs natively (and faster) on this kind of device, and why in a few words."""
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
        speedup = _matmul_seconds(torch.float32) / _matmul_seconds(torch.bfloat16)
    if speedup < PROBE_MIN_SPEEDUP:
        return False, f"{units[0]}, but bf16 matmul only {speedup:.1f}x fp32"
    return True, f"{units[0]}, bf16 matmul {speedup:.1f}x fp32"


def choose(setting, device: torch.device) -> tuple[bool, str]:
    """Resolve ``train.bf16`` for ``device``: (use bf16, the reason a report can show)."""
    setting = normalize(setting)
    if setting == "false":
        return False, "train.bf16=false"
    native, why = bf16_native(device.type)
    if setting == "true":
        if not native:
            _warn_emulated(why)
        return True, f"train.bf16=true ({why})"
    return native, f"auto: {why}"


@functools.lru_cache(maxsize=None)
def _warn_emulated(why: str) -> None:
    warnings.warn(f"train.bf16=true but bf16 is not native here ({why}): expect it to be much slower than fp32",
                  stacklevel=3)
