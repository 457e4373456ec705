"""Export an encoder-only or tagging model (the network and its head) to ONNX, checked against our logits.

CTranslate2 has no place for a classifier's head (:mod:`taskformer.core.export`); ONNX takes any
network torch can trace. The graph comes from torch's own exporter (``torch.onnx.export(dynamo=True)``,
which traces with ``torch.export``), with the batch and the source length dynamic (the length up to
``model.max_len``), at opset :data:`OPSET`. Before anything is written, ONNX Runtime runs the graph on
probe batches of another size and padding than the one traced, and the export is refused where its
logits differ from ours by more than :data:`TOLERANCE` of their scale: a graph that traced one branch
of the model, or an operator the runtime computes otherwise, never reaches the user. The check runs
the graph in the session :func:`session` makes, as ``decode.engine`` runs it.

``onnx``, ``onnxscript`` (the exporter's) and ``onnxruntime`` are optional (``taskformer[export]``).
"""
from __future__ import annotations

import copy
import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

from taskformer.core.export import ExportError, _write_folder
from taskformer.core.model import BOS, EOS, PAD

if TYPE_CHECKING:
    import onnx
    import torch

    from taskformer.core.model import Ensemble, Transformer

# ONNX 1.18's operators, read by ONNX Runtime from 1.23 on (onnxruntime.ai/docs/reference/compatibility.html):
# from opset 23 torch's exporter writes attention as one Attention node, where opset 20 spelled it in
# fifteen (scores, mask, softmax, the keys' reshapes); the agnews network's session call took a tenth less.
OPSET = 23
TOLERANCE = 1e-4  # the largest logit difference allowed, relative to the largest logit (at least 1)
MODEL = "model.onnx"
# ONNX Runtime's fusion of a residual Add and a LayerNormalization into its SkipLayerNormalization: that
# CPU kernel took 3 to 5 times as long as the two it replaces at d_model 128 (ONNX Runtime 1.32).
SLOWER_FUSIONS = "SkipLayerNormFusion"


def _requirements() -> None:
    missing = [name for name in ("onnx", "onnxscript", "onnxruntime") if not _importable(name)]
    if missing:
        raise ExportError(f"exporting to ONNX needs the {', '.join(missing)} package{'s' * (len(missing) > 1)}: "
                          "pip install taskformer[export]")


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def probe(model: Transformer, batch: int, length: int, padded: bool, seed: int = 0) -> torch.Tensor:
    """Source ids framed as the model reads them: ``[BOS] + ids``, a pair's two texts split by EOS,
    the last row shorter by a third (padding) where ``padded``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, model.cfg.vocab_size, (batch, length), generator=g)
    src[:, 0] = BOS
    if model.cfg.pairs:
        src[:, length // 2] = EOS
        src[:, -1] = EOS
    if padded and batch > 1:
        cut = max(length * 2 // 3, 2)
        src[-1, cut:] = PAD
        if model.cfg.pairs:
            src[-1, cut - 1] = EOS
    return src


def session(path: Path, device: str = "cpu", threads: int = 1):
    """An ONNX Runtime session of the exported model at ``path``, as taskformer runs it (the export's
    check and ``decode.engine``): every graph optimization but :data:`SLOWER_FUSIONS`, and ``threads``
    intra-op threads. One by default: a small network's batch-1 call then wakes no thread pool, and
    the batches of a call run side by side on ``decode.workers`` threads (the call releases the GIL)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("optimization.disable_specified_optimizers", SLOWER_FUSIONS)
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # warnings about the graph's unused initializers are not the user's
    providers = ["CUDAExecutionProvider"] if device == "cuda" else []
    return onnxruntime.InferenceSession(str(path), options, providers=providers + ["CPUExecutionProvider"])


def attention_on_widths(model: onnx.ModelProto, heads: int) -> None:
    """Give each ``Attention`` node its 3-D form in place: the query, key and value as (batch, length,
    width) with ``q_num_heads`` = ``kv_num_heads`` = ``heads``, the output as the same, instead of the
    reshape and transpose to (batch, heads, length, width / heads) around it that torch's exporter
    writes for ``MultiHeadAttention._heads`` and back (8 nodes a layer, and their shapes': the agnews
    network's session call took 7 to 11% less). Nodes whose neighbours are anything else are left as
    they are; the export's check runs the result."""
    from onnx import helper

    nodes = model.graph.node
    made = {name: node for node in nodes for name in node.output}
    readers: dict[str, list] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in model.graph.output}

    def maker(name: str) -> Any:
        return made.get(name)

    def reader(name: str) -> Any:  # the one node that reads ``name``, or None
        found = readers.get(name, [])
        return found[0] if len(found) == 1 and name not in outputs else None

    def is_op(node: Any, op: str) -> bool:
        return node is not None and node.op_type == op

    def is_swap(node: Any) -> bool:  # a Transpose of axes 1 and 2 of four
        return is_op(node, "Transpose") and [list(a.ints) for a in node.attribute if a.name == "perm"] == [[0, 2, 1, 3]]

    gone: set[int] = set()
    for attention in [n for n in nodes if n.op_type == "Attention" and n.domain in ("", "ai.onnx")]:
        if len(attention.input) < 3 or any(a.name.endswith("num_heads") for a in attention.attribute):
            continue
        swaps = [maker(name) for name in attention.input[:3]]
        splits: list[Any] = [maker(swap.input[0]) if is_swap(swap) else None for swap in swaps]
        back = reader(attention.output[0])
        merge: Any = reader(back.output[0]) if is_swap(back) else None
        if not (is_op(merge, "Reshape") and all(is_op(split, "Reshape") for split in splits)
                and all(reader(node.output[0]) is not None for node in [*swaps, *splits])):
            continue
        for i, split in enumerate(splits):
            attention.input[i] = split.input[0]
        attention.output[0] = merge.output[0]
        attention.attribute.extend([helper.make_attribute("q_num_heads", heads),
                                    helper.make_attribute("kv_num_heads", heads)])
        gone.update(map(id, [*swaps, *splits, back, merge]))
    live, kept = set(outputs), []  # the nodes left that an output needs (their shapes' Concats go too)
    for node in reversed([node for node in nodes if id(node) not in gone]):  # nodes are in topological order
        if live.intersection(node.output):
            kept.append(node)
            live.update(node.input)
    del nodes[:]
    nodes.extend(reversed(kept))


def check_exportable(model: Transformer | Ensemble) -> Transformer:
    from taskformer.core.model import Ensemble

    if model.cfg.kind.decoder:
        raise ExportError(f"ONNX export is for encoder-only and tagging models; this one is {model.cfg.variant} "
                          "(export it to CTranslate2: --to ctranslate2)")
    if isinstance(model, Ensemble):
        raise ExportError(f"this model is an ensemble of {len(model.members)} networks (model.members); the ONNX "
                          "export writes one network: decode the ensemble with taskformer, or train with model.members=1")
    return model


PROBABILITIES = "probabilities"  # the engine's graph of a classifier: its softmax, beside the logits


def for_engine(net: Transformer) -> torch.nn.Module:
    """``net`` as ``decode.engine`` runs it on ONNX Runtime, which gets batches whose rows all have one
    length (``decode_texts`` batches sources so): no row has padding, so the graph makes and applies
    no padding mask, and the built-in head pools over every position (ReduceMean where the padded
    graph multiplies by the mask, sums and divides by its count); a plugin's own head may read the
    mask, and gets it. A classifier's graph gives its probabilities too (:data:`PROBABILITIES`, the
    softmax of the logits): in the session they cost a node, in numpy after it five calls that
    took a tenth of a batch-1 ``predict``."""
    import torch

    from taskformer.core.model import DEFAULT_HEADS

    class ForEngine(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, src: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
            if type(self.net.head) is DEFAULT_HEADS[self.net.cfg.variant]:
                logits = self.net.head(self.net.memory(src, None), None)
            else:
                logits = self.net(src)
            return logits if self.net.cfg.kind.per_word else (logits, logits.float().softmax(-1))

    return ForEngine()


def build(model: Transformer | Ensemble, path: Path, tolerance: float = TOLERANCE, engine: bool = False) -> float:
    """Write ``model`` as one ONNX file at ``path`` and check it against our logits; returns the largest
    difference found. Raises :class:`ExportError`, with ``path`` removed, where it is above ``tolerance``.
    ``engine``: the graph ``decode.engine`` runs (:func:`for_engine`), checked on batches of one length."""
    import numpy as np
    import onnx
    import torch

    _requirements()
    # a copy: the exporter swaps the network's weights for fake ones while it traces, and another thread
    # (a decode worker, a timing probe) may be running the same network meanwhile
    net = copy.deepcopy(check_exportable(model)).eval().cpu()
    traced = for_engine(net) if engine else net
    padded = not engine
    outputs = ["logits", PROBABILITIES] if engine and not net.cfg.kind.per_word else ["logits"]
    length = min(12, net.cfg.max_len)
    batch, positions = torch.export.Dim("batch", min=1), torch.export.Dim("length", min=2, max=net.cfg.max_len)
    path.parent.mkdir(parents=True, exist_ok=True)
    quiet = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "onnxscript")]
    levels = [logger.level for logger in quiet]
    try:
        for logger in quiet:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the exporter's notes on ops it registered, for its own developers
            program = torch.onnx.export(traced, (probe(net, 3, length, padded=padded),), dynamo=True, opset_version=OPSET,
                                        input_names=["src"], output_names=outputs, verbose=False,
                                        dynamic_shapes={"src": {0: batch, 1: positions}}, external_data=False)
            assert program is not None  # the dynamo exporter always returns its program
            graph = program.model_proto
            attention_on_widths(graph, net.cfg.n_heads)
            onnx.save_model(graph, str(path))
    except Exception as e:
        path.unlink(missing_ok=True)
        if isinstance(e, ExportError):
            raise
        raise ExportError(f"torch could not export this model to ONNX: {str(e).strip().splitlines()[0][:300]}") from None
    finally:
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)
    runtime = session(path)
    worst = 0.0
    with torch.no_grad():
        for shape, with_padding in (((1, 2), False), ((5, min(20, net.cfg.max_len)), padded), ((2, length), False)):
            src = probe(net, *shape, padded=with_padding, seed=1)
            ours = net(src).float().numpy()
            theirs = runtime.run(None, {"src": src.numpy()})[0]
            scale = max(1.0, float(np.abs(ours).max()))
            worst = max(worst, float(np.abs(ours - theirs).max()) / scale)
    if not worst <= tolerance:  # NaN too
        path.unlink(missing_ok=True)
        raise ExportError(f"the ONNX model's logits differ from taskformer's by {worst:.3g} of their scale (at most "
                          f"{tolerance:g} allowed); nothing was written")
    return worst


def quantized(fp32: Path, path: Path) -> None:
    """An int8 copy of a checked ONNX model: ONNX Runtime's dynamic quantization (int8 weights, inputs
    quantized per call), the counterpart of ``decode.quantize=int8``; its logits are not ours to the
    tolerance, by design. The matrix products and the embedding's lookup are quantized: the quantizer
    takes ONNX's Attention for ONNX Runtime's own operator of that name and writes an invalid graph."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process image models is not the user's to act on
    try:
        quantize_dynamic(str(fp32), str(path), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gather"])
    finally:
        root.setLevel(level)


def to_onnx(model: Transformer | Ensemble, tokenizer: Tokenizer, out_dir: str | Path, overwrite: bool = False,
            info: dict | None = None, tolerance: float = TOLERANCE) -> Path:
    """Write ``model`` as ``model.onnx`` in ``out_dir`` (input ``src``: ids (batch, length); output
    ``logits``), with ``tokenizer.json`` and the manifest beside it; refused where the check fails."""
    check_exportable(model)
    _requirements()
    manifest = {**(info or {}), "opset": OPSET}

    def write(folder: Path) -> None:  # the manifest is written after this: it records the check
        manifest["largest_logit_difference"] = build(model, folder / MODEL, tolerance)

    return _write_folder(out_dir, overwrite, write, tokenizer, manifest)
