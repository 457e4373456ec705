"""The model that decodes: the trained one, or an int8 copy of it (``decode.quantize``).

``int8`` is PyTorch's dynamic quantization (``torch.ao.quantization.quantize_dynamic``): every
``nn.Linear`` of a copy of the model gets int8 weights with a scale per output row (as CTranslate2's
int8), packed once, and quantizes its input on the fly at each call; embeddings, layer norms and
attention stay fp32. Cross-attention's query and
key/value rows of ``in_proj`` become modules of their own first (``split_cross``), so that they are
quantized too. The saved weights and training never see the copy.

The copy is made once per model and reused while the model's parameters are unchanged (their
version counters), so repeated ``predict`` calls pay for it once and validation during training
quantizes the current weights.
"""
from __future__ import annotations

import copy
import threading
import warnings
import weakref

import torch
from torch import nn

from taskformer.core.model import MultiHeadAttention

QUANTIZE = ("none", "int8")
_copies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (parameter versions, int8 copy)
_lock = threading.Lock()  # decoding workers share one copy


def int8(model: nn.Module) -> nn.Module:
    """An inference copy of ``model`` with int8 linear layers (on CPU, in eval mode)."""
    twin = copy.deepcopy(model).cpu().eval()
    for m in twin.modules():
        if isinstance(m, MultiHeadAttention):
            m.split_cross()
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
        warnings.filterwarnings("ignore", ".*deprecated")
        return torch.ao.quantization.quantize_dynamic(
            twin, {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig})  # a scale per output row


def for_decoding(model: nn.Module, quantize: str) -> nn.Module:
    """The model to decode with: ``model`` itself, or (``"int8"``) its int8 copy, made when its weights changed."""
    if quantize == "none":
        return model
    if quantize != "int8":
        raise ValueError(f"decode.quantize must be one of {', '.join(QUANTIZE)}, not {quantize!r}")
    versions = tuple(p._version for p in model.parameters())
    with _lock:
        kept = _copies.get(model)
        if kept is None or kept[0] != versions:
            kept = _copies[model] = (versions, int8(model))
    return kept[1]
