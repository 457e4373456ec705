"""The model that decodes: an inference copy of the trained one, made once per set of weights.

Training keeps ``nn.Linear``; decoding reads every weight matrix once per step, so how those
products run decides its speed. On CPU the copy's linear layers are :class:`PackedLinear`: oneDNN's
matrix product on weights laid out for it once (pre-packed), where ``nn.Linear`` calls MKL on the
weights as stored. On an AMD EPYC, MKL ran these products at less than half the rate of oneDNN
and streamed cold weights at a third of its speed, which is most of a step at one sentence
(docs/benchmarks.md). Elsewhere (GPUs, a torch without oneDNN) the model decodes as it is.

``decode.quantize=int8`` instead gives a copy quantized by torchao
(``Int8DynamicActivationInt8WeightConfig``): every ``nn.Linear`` gets int8 weights with a scale per
output row, and its input is quantized on the fly with a scale per token, the granularity of
CTranslate2's int8 (on a CPU without VNNI, whose int8 products saturate, the weights only: see
:func:`int8`); embeddings, layer norms and attention stay fp32. Run as it is, each such layer
is a handful of tensor operations, slower than fp32 at one sentence; with ``decode.compile`` the
compiler fuses them into the step (docs/benchmarks.md has both).

Both copies first give cross-attention's query and key/value rows of ``in_proj`` modules of their
own (``split_cross``), so that they are packed or quantized too. The saved weights and training
never see a copy. A copy is made once per model and reused while the model's parameters are
unchanged (their version counters), so repeated ``predict`` calls pay for it once. A fused
optimizer's step writes the weights without moving those counters, so the training engine also
drops the copy after every update (:func:`forget`): validation decodes the current weights.
"""
from __future__ import annotations

import copy
import functools
import logging
import threading
import weakref
from typing import TYPE_CHECKING, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from taskformer.core.decode_config import QUANTIZE
from taskformer.core.model import Ensemble, MultiHeadAttention, SequenceModel, Transformer

if TYPE_CHECKING:
    from taskformer.core.compiled import Compiled

Net = TypeVar("Net", bound=nn.Module)

_copies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (key, copy)
_lock = threading.Lock()  # decoding workers share one copy


class PackedLinear(nn.Module):
    """``nn.Linear`` for inference on CPU: oneDNN's product on weights packed once for it.

    Under bf16 autocast (``train.bf16``) it computes in bf16 as ``nn.Linear`` would there, from a
    bf16 packing made the first time it is needed (or through ``nn.Linear``'s product where oneDNN
    cannot pack bf16: a CPU without bf16 instructions, forced). ``weight`` and ``bias`` stay the
    original parameters, for code that reads them.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.packed: dict[torch.dtype, torch.Tensor | None] = {torch.float32: _pack(linear.weight.detach())}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
        if dtype not in self.packed:
            try:
                self.packed[dtype] = _pack(self.weight.detach().to(dtype))
            except RuntimeError:  # oneDNN packs bf16 only where the CPU has bf16 instructions (forced bf16)
                self.packed[dtype] = None
        if self.packed[dtype] is None:
            return F.linear(x, self.weight, self.bias)
        bias = None if self.bias is None else self.bias.to(dtype)
        rows = x.shape[:-1].numel()
        extra = padded_rows(rows) - rows
        if not extra:  # one sentence's step, a full batch: as it comes, no copy
            return torch.ops.mkldnn._linear_pointwise(x.to(dtype), self.packed[dtype], bias, "none", [], "")
        flat = x.to(dtype).reshape(rows, x.size(-1))
        flat = F.pad(flat, (0, 0, 0, extra))  # zero rows, whose outputs are dropped
        return torch.ops.mkldnn._linear_pointwise(flat, self.packed[dtype], bias, "none", [], "")[:rows].view(
            *x.shape[:-1], -1)

    def extra_repr(self) -> str:
        return f"in_features={self.weight.size(1)}, out_features={self.weight.size(0)}, bias={self.bias is not None}"


def padded_rows(rows: int) -> int:
    """The rows a product is computed for: ``rows`` itself up to 8, the next power of two up to 64,
    above it the next multiple of an eighth of the next power of two (10 -> 16, 100 -> 112, 640 -> 640).

    oneDNN makes, and keeps, a kernel of its own for every number of rows it is given, about 0.6 MB
    each, and its caches hold a thousand or more. Every batch a server decodes, and every step of a
    batch whose finished sentences have left it, brings a new number of rows: the memory of
    ``taskformer serve`` would grow by hundreds of megabytes under load. Rounded so, a product shape
    has at most 11 row counts up to 64 and 4 per doubling above. One sentence's steps (1 row, or a
    beam's 5) and the usual batch sizes are computed as they come; up to 64 rows a product costs what
    reading the weights costs, and above it the zero rows add at most a quarter (docs/benchmarks.md).
    """
    if rows <= 8:
        return rows
    if rows <= 64:
        return 1 << (rows - 1).bit_length()
    step = (1 << (rows - 1).bit_length()) // 8
    return -(-rows // step) * step


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())


@functools.cache
def _packs_here() -> bool:
    """Whether this torch can pack a linear layer for oneDNN (a CPU build with it, on a CPU it supports)."""
    try:
        lin = nn.Linear(4, 2)
        with torch.no_grad():
            return torch.allclose(PackedLinear(lin)(torch.ones(3, 4)), lin(torch.ones(3, 4)), atol=1e-5)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def _split(model: Net) -> Net:
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            m.split_cross()
    return model


def packed(model: Net) -> Net:
    """An inference copy of ``model`` (on CPU, in eval mode) whose linear layers are :class:`PackedLinear`.

    The copy shares the model's parameters; the packed weights (one more copy of the linear layers'
    weights) and cross-attention's split rows are new memory."""
    twin = _split(copy.deepcopy(model, memo={id(p): p for p in model.parameters()}).eval())

    def swap(module: nn.Module) -> None:
        for name, child in module.named_children():
            if type(child) is nn.Linear:
                setattr(module, name, PackedLinear(child))
            else:
                swap(child)
    swap(twin)
    return twin


def int8(model: Net) -> Net:
    """An inference copy of ``model`` with int8 linear layers (on CPU, in eval mode): int8 products of
    int8 inputs where this CPU computes them exactly (:func:`_int8_products_exact`), else int8 weights
    read into fp32 products (``Int8WeightOnlyConfig``)."""
    quantize_, dynamic, weight_only = _torchao()
    twin = _split(copy.deepcopy(model).cpu().eval())
    quantize_(twin, dynamic() if _int8_products_exact() else weight_only())
    return twin


def _torchao():
    """torchao's ``quantize_`` and its two int8 configs. Importing it logs the GPU kernels a CPU torch
    cannot load and a registration torch frowns on, which a user need not read."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
    return quantize_, Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig


@functools.cache
def _int8_products_exact() -> bool:
    """Whether int8 x int8 products come out right here. Without VNNI instructions (an AVX2 CPU, or
    one held to AVX2 by ONEDNN_MAX_CPU_ISA) oneDNN adds pairs of products in 16 bits, which saturate
    for inputs near the ends of the int8 range, where torchao's per-token scales put them: most
    outputs then differ from fp32. Checked once on a layer whose inputs and weights quantize to 127."""
    quantize_, dynamic, _ = _torchao()
    layer = nn.Linear(64, 8, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
        x = torch.ones(2, 64)
        quantized = copy.deepcopy(layer)
        quantize_(quantized, dynamic())
        return torch.allclose(quantized(x), layer(x), rtol=1e-2)


def compiled(model: Transformer | Ensemble, quantize: str = "none") -> Compiled:
    """An inference copy of ``model`` (sharing its parameters, in eval mode; or its int8 copy) whose
    one-token decoding step is compiled (:mod:`taskformer.core.compiled`); Inductor packs the weights itself."""
    from taskformer.core.compiled import Compiled  # imports the compiler's machinery only when asked for
    twin = int8(model) if quantize == "int8" else copy.deepcopy(model, memo={id(p): p for p in model.parameters()})
    return Compiled(twin.eval())


def for_decoding(model: Transformer | Ensemble, quantize: str, compile: bool = False) -> SequenceModel:
    """The model to decode with: with ``compile`` its copy with a compiled step; else (``"int8"``) its
    int8 copy, or (``"none"``) on CPU its packed copy and elsewhere ``model`` itself. A copy is made
    anew when the model's weights changed."""
    if quantize not in QUANTIZE:
        raise ValueError(f"decode.quantize must be one of {', '.join(QUANTIZE)}, not {quantize!r}")
    if not compile and quantize == "none" and (next(model.parameters()).device.type != "cpu" or not _packs_here()):
        return model
    versions = tuple(p._version for p in model.parameters())
    with _lock:
        kept = _copies.get(model)
        if kept is None or kept[0] != (quantize, compile, versions):
            twin = compiled(model, quantize) if compile else int8(model) if quantize == "int8" else packed(model)
            kept = _copies[model] = ((quantize, compile, versions), twin)
    return kept[1]


def compile_record(model: Transformer | Ensemble, compile: bool) -> dict[str, str]:
    """What ``decode.compile`` did for ``model``'s decoding, as a record states it: nothing where it was not
    asked for; else that the step ran compiled, or that its compiler failed and the step ran as it is
    (the setting alone would say compiled)."""
    if not compile:
        return {}
    kept = _copies.get(model)
    failed = getattr(kept[1], "failed", None) if kept else None
    return {"compile": f"failed ({failed}); decoded without it" if failed else "compiled decoding step"}
