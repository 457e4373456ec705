"""A decoding step with static shapes, compiled (``decode.compile``).

One sentence at a time, a decoding step is some 150 small operations, each dispatched from Python
at about 10 µs, while its arithmetic takes less: the step's time is the interpreter's, not the
CPU's. TorchInductor compiles the step into one graph of generated C++ loops and oneDNN products
with no per-operation dispatch. A compiled graph holds for the shapes it was compiled for, so the
step keeps a static key/value cache (``MultiHeadAttention._append`` given a position tensor):
buffers of a fixed number of slots, written at the step's position and read through a mask.
The slots are rounded up to a power of two, so that sentences of other lengths reuse the graph.
Only the one-token step is compiled; the prefix (BOS, or a prompt) is read by the model as it is.

On a GPU the step is captured as a CUDA graph (Inductor's ``triton.cudagraphs``): one launch replays
the step's kernels. A graph reads its inputs at fixed addresses, so there the cache lives in buffers
kept per shape (each thread its own): a search's cache is copied into them once, at its first
compiled step, and a beam's reordering copies into them instead of making new ones.

Inductor keeps what it compiled in its cache folder (``TORCHINDUCTOR_CACHE_DIR``; by default the
user's ``taskformer/compiled`` cache, keyed there by the torch version and the CPU), never in a run
directory: a run directory may come from someone else, and compiled code from it would run as is.
Where compilation is unavailable (no C++ compiler) or fails, decoding goes on with the model as
it is and says so once.
"""
from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from taskformer.core.model import SequenceModel

MIN_SLOTS = 16


def slots(steps: int, room: int) -> int:
    """The static cache's slots for a search of ``steps`` positions: the next power of two (at least
    ``MIN_SLOTS``), within the model's ``room`` of positions."""
    return min(max(MIN_SLOTS, 1 << max(steps - 1, 0).bit_length()), room)


def cache_folder() -> Path:
    """Where Inductor keeps compiled steps: ``TORCHINDUCTOR_CACHE_DIR`` if set, else a folder of the
    user's cache (``XDG_CACHE_HOME`` or ``~/.cache``) per torch version and CPU capability, since
    code compiled for one CPU's instructions may not run on another."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cpu = torch.backends.cpu.get_cpu_capability()
    return base / "taskformer" / "compiled" / f"torch-{torch.__version__}-{cpu}".replace("+", "-")


class Compiled(nn.Module):
    """``model``'s decoding interface (``encode``, ``decode``, ``head``, ``new_cache``,
    ``reorder_cache``) whose one-token ``decode`` runs compiled over a static cache.

    ``static`` tells the search to give positions as tensors (see ``Reader``). The first step of a
    new shape compiles (tens of seconds on two cores, or what Inductor's cache gives); if compiling
    fails, every later step runs the model as it is. ``backend`` is ``torch.compile``'s (``"eager"``
    traces the step without generating code: the static cache's logic alone).
    """

    static = True

    def __init__(self, model: SequenceModel, backend: str = "inductor",
                 options: dict[str, str | int | bool | Callable[..., Any]] | None = None):
        super().__init__()
        self.model: SequenceModel = model
        self.cfg = model.cfg
        self.gpu = next(model.parameters()).device.type == "cuda"
        self.failed: str | None = None  # why compiling failed, once it has: a record says the step ran as it is
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_folder()))
        if options is None and backend == "inductor":
            # CPU: Inductor's C++ wrapper calls the kernels without Python; freezing folds the weights into
            # the graph as constants, packed once for oneDNN (bench/race/compiled.py measured both).
            # GPU: a CUDA graph replays the step's kernels in one launch (bench/race/gpu_decode.py).
            options = {"triton.cudagraphs": True} if self.gpu else {"cpp_wrapper": True, "freezing": True}
        self._step: Callable[..., torch.Tensor] | None = torch.compile(model.decode, fullgraph=True, backend=backend,
                                                                       options=options)
        self._pool = threading.local()  # GPU: this thread's cache buffers, by place in the cache and shape

    def _pin(self, cache) -> None:
        """Put the cache in this thread's kept buffers of its shapes, so a CUDA graph finds it there."""
        pool = self._pool.__dict__.setdefault("buffers", {})
        for i, (part, name) in enumerate(_buffers(cache)):
            key = (i, tuple(part[name].shape), part[name].dtype)
            kept = pool.setdefault(key, part[name])
            if kept is part[name]:
                torch._dynamo.mark_static_address(kept)
            else:
                part[name] = kept.copy_(part[name])

    def encode(self, src: torch.Tensor):
        return self.model.encode(src)

    def head(self, hidden: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.model.head(hidden, src_mask)

    def decode(self, tgt: torch.Tensor, memory, memory_mask, cache=None, start: int | torch.Tensor = 0):
        # the first position (BOS) and a prompt are read as they are: they make the cache the step then reads
        if self._step is not None and tgt.size(1) == 1 and isinstance(start, torch.Tensor) and int(start) > 0:
            if self.gpu:  # the graph reads the cache where it was captured, and the last step's output is spent
                self._pin(cache)
                torch.compiler.cudagraph_mark_step_begin()
            try:  # the new tokens are a column of the search's table: copied, so their strides are always alike
                return self._step(tgt.clone(memory_format=torch.contiguous_format), memory, memory_mask, cache, start)
            except Exception as error:  # noqa: BLE001 -- any failure of the compiler: decode as before
                self._step = None
                self.failed = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                warnings.warn(f"decode.compile: compiling the decoding step failed ({self.failed}); decoding without it",
                              stacklevel=2)
        return self.model.decode(tgt, memory, memory_mask, cache, start)

    def new_cache(self, steps: int = 0):
        return self.model.new_cache(slots(steps, self.cfg.max_len))

    def reorder_cache(self, cache, index: torch.Tensor, sentences: torch.Tensor | None = None) -> None:
        before = [(part, name, part[name]) for part, name in _buffers(cache)] if self.gpu else []
        self.model.reorder_cache(cache, index, sentences)
        for part, name, buffer in before:  # a CUDA graph reads the buffers it was captured with: keep them
            if part[name] is not buffer and part[name].shape == buffer.shape:
                part[name] = buffer.copy_(part[name])

    def attention_maps(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.model.attention_maps(src, tgt_in)


def _parts(cache):
    """The cache's dicts that hold keys and values, however members and layers nest them."""
    if isinstance(cache, dict):
        if "k" in cache:
            yield cache
        for value in cache.values():
            if isinstance(value, (dict, list)):
                yield from _parts(value)
    elif isinstance(cache, list):
        for item in cache:
            yield from _parts(item)


def _buffers(cache):
    """``(part, name)`` of every key and value buffer of the cache."""
    for part in _parts(cache):
        yield from ((part, name) for name in ("k", "v") if name in part)
