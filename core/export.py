"""Export an encoder-decoder or decoder-only model to CTranslate2, through CTranslate2's own converter API.

This module knows the weight layout of :class:`taskformer.core.model.Transformer` and nothing of
tasks or plugins. The mapping onto ``ctranslate2.specs.TransformerSpec`` (a decoder-only model:
``TransformerDecoderModelSpec``, the decoder alone, which ``ctranslate2.Generator`` runs):

* ``in_proj`` stacks the query, key and value rows: it is CTranslate2's fused self-attention
  projection as it is; cross-attention takes its query rows and its key/value rows apart.
* ``norms[0..2]`` are the layer norms before (pre-norm) or after (post-norm) self-attention,
  cross-attention and the ReLU feed-forward; ``enc_norm``/``dec_norm`` the final pre-norm ones.
* Tied embeddings: the one matrix is written as source and target embeddings and output
  projection (CTranslate2 stores it once). Embeddings are scaled by sqrt(d_model), as ours.
* Positions: our sinusoidal table (position 0 = first token, sin/cos interleaved) is written into
  the spec; left empty, CTranslate2 would build its own table, laid out differently.

``ctranslate2`` is an optional dependency (``pip install taskformer[export]``): it is imported
only when an export runs, and so are torch and the model (the command line reads
:data:`QUANTIZATIONS` for its help, which should not wait for them).
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from taskformer.core.errors import TaskformerError
from taskformer.core.tokenize import SPECIALS

if TYPE_CHECKING:
    import torch

    from taskformer.core.model import Ensemble, Transformer

QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
                 "bfloat16")
MANIFEST = "taskformer.json"  # written last by every export: where it came from and the files it wrote


class ExportError(TaskformerError):
    """The model or the output folder cannot be exported as asked; the message says why."""


class ExportExists(ExportError):
    """The output folder holds an earlier export, and replacing it was not asked for."""


def _numpy(t: torch.Tensor):
    """A copy of ``t`` in fp32 numpy: CTranslate2's quantizer scales the arrays it is given in place,
    and a view of an fp32 CPU parameter would hand it the model's own weights."""
    return t.detach().cpu().float().numpy().copy()


def check_exportable(model: Transformer | Ensemble) -> Transformer:
    """Refuse models CTranslate2's ``TransformerSpec`` cannot express, before any work is done; returns the
    network that exports."""
    from taskformer.core.model import Ensemble, Generator

    if not model.cfg.kind.exportable:
        raise ExportError(
            "only encoder-decoder and decoder-only models can be exported to CTranslate2: its encoder-only models "
            "(ctranslate2.Encoder) end in hidden states or a BERT first-token pooler, with no place "
            "for this model's classification head (pooling + two-layer MLP), so no labels would come out")
    if isinstance(model, Ensemble):
        raise ExportError(f"this model is an ensemble of {len(model.members)} networks (model.members), and CTranslate2 "
                          "has no ensemble decoding; decode it with taskformer (predict, serve), or train with "
                          "model.members=1 to export")
    if type(model.head) is not Generator:
        raise ExportError(f"the task's plugin gives the model its own output head ({type(model.head).__name__}); "
                          "CTranslate2 has only a linear projection to the vocabulary")
    return model


def _load_ctranslate2():
    try:
        import ctranslate2  # noqa: F401
        from ctranslate2.converters import Converter
        from ctranslate2.specs import common_spec, transformer_spec
    except ImportError:
        raise ExportError("exporting to CTranslate2 needs the ctranslate2 package: pip install taskformer[export]") from None
    return Converter, common_spec, transformer_spec


def _converter_class():
    """Build the ``Converter`` subclass on demand, since ``ctranslate2`` may not be installed."""
    Converter, common_spec, transformer_spec = _load_ctranslate2()

    def linear(spec, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        spec.weight = _numpy(weight)
        if bias is not None:
            spec.bias = _numpy(bias)

    def norm(spec, ln: torch.nn.LayerNorm) -> None:
        spec.gamma, spec.beta = _numpy(ln.weight), _numpy(ln.bias)

    def attention(spec, attn, cross: bool) -> None:
        d = attn.d
        w, b = attn.in_proj.weight, attn.in_proj.bias
        if cross:  # CTranslate2 keeps the query projection apart from the fused key/value one
            linear(spec.linear[0], w[:d], b[:d])
            linear(spec.linear[1], w[d:], b[d:])
        else:
            linear(spec.linear[0], w, b)
        linear(spec.linear[-1], attn.out_proj.weight, attn.out_proj.bias)

    def block(spec, blk) -> None:
        attention(spec.self_attention, blk.self_attn, cross=False)
        norm(spec.self_attention.layer_norm, blk.norms[0])
        if blk.cross_attn is not None:
            attention(spec.attention, blk.cross_attn, cross=True)
            norm(spec.attention.layer_norm, blk.norms[1])
        first, _, _, last = blk.ff  # Linear, ReLU, Dropout, Linear
        linear(spec.ffn.linear_0, first.weight, first.bias)
        linear(spec.ffn.linear_1, last.weight, last.bias)
        norm(spec.ffn.layer_norm, blk.norms[-1])

    class TaskformerConverter(Converter):
        """Fills a ``TransformerSpec`` from a taskformer model and its tokenizer's vocabulary."""

        def __init__(self, model: Transformer, vocabulary: list[str]):
            self.model, self.vocabulary = model, vocabulary

        def _load(self):
            m, cfg = self.model, self.model.cfg
            if m.encoder is None:
                return self._language_model()
            spec = transformer_spec.TransformerSpec.from_config(
                (cfg.enc_layers, cfg.dec_layers), cfg.n_heads, pre_norm=cfg.norm_first,
                activation=common_spec.Activation.RELU)
            positions = _numpy(m.positions.pe)
            spec.encoder.embeddings[0].weight = _numpy(m.embed.weight)
            spec.encoder.position_encodings.encodings = positions
            for layer_spec, blk in zip(spec.encoder.layer, m.encoder):
                block(layer_spec, blk)
            target = m.embed if m.tgt_embed is None else m.tgt_embed
            spec.decoder.embeddings.weight = _numpy(target.weight)
            spec.decoder.position_encodings.encodings = positions
            for layer_spec, blk in zip(spec.decoder.layer, m.decoder):
                block(layer_spec, blk)
            if cfg.norm_first:
                norm(spec.encoder.layer_norm, m.enc_norm)
                norm(spec.decoder.layer_norm, m.dec_norm)
            linear(spec.decoder.projection, m.head.proj.weight, m.head.proj.bias)
            spec.register_source_vocabulary(self.vocabulary)
            spec.register_target_vocabulary(self.vocabulary)
            # Our specials (ids 0..3); sources are framed as taskformer frames them: tokens + [EOS].
            spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = SPECIALS[3], SPECIALS[1], SPECIALS[2]
            spec.config.decoder_start_token = SPECIALS[1]
            spec.config.add_source_eos = True
            spec.config.layer_norm_epsilon = m.encoder[0].norms[0].eps
            return spec

        def _language_model(self):
            """A decoder-only model: the decoder stack without cross-attention; a prompt is its start."""
            m, cfg = self.model, self.model.cfg
            spec = transformer_spec.TransformerDecoderModelSpec.from_config(
                cfg.dec_layers, cfg.n_heads, pre_norm=cfg.norm_first, activation=common_spec.Activation.RELU,
                no_final_norm=not cfg.norm_first)
            spec.decoder.embeddings.weight = _numpy(m.embed.weight)
            spec.decoder.position_encodings.encodings = _numpy(m.positions.pe)
            for layer_spec, blk in zip(spec.decoder.layer, m.decoder):
                block(layer_spec, blk)
            if cfg.norm_first:
                norm(spec.decoder.layer_norm, m.dec_norm)
            linear(spec.decoder.projection, m.head.proj.weight, m.head.proj.bias)
            spec.register_vocabulary(self.vocabulary)
            spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = SPECIALS[3], SPECIALS[1], SPECIALS[2]
            spec.config.layer_norm_epsilon = m.decoder[0].norms[0].eps
            return spec

    return TaskformerConverter


def vocabulary(tokenizer: Tokenizer, size: int) -> list[str]:
    """The tokenizer's tokens in id order, which CTranslate2 takes as its vocabulary list."""
    by_id = {i: t for t, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    missing = [i for i in range(size) if i not in by_id]
    if missing or len(by_id) != size:
        raise ExportError(f"the tokenizer's {len(by_id)} tokens do not cover the model's {size} ids "
                          f"(first missing id: {missing[0] if missing else size})")
    return [by_id[i] for i in range(size)]


def earlier_export(out_dir: Path) -> list[str] | None:
    """The files an earlier export wrote into ``out_dir``, as its manifest lists them; None where
    there is no manifest of ours (a link or anything but a list of plain file names is not ours)."""
    from taskformer.core.checkpoint import read_json

    path = out_dir / MANIFEST
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        files = read_json(path).get("files")
    except (OSError, TaskformerError, AttributeError):
        return None
    if not isinstance(files, list) or MANIFEST not in files or not all(
            isinstance(f, str) and f not in ("", ".", "..") and Path(f).name == f for f in files):
        return None
    return files


def _replaceable(out_dir: Path, overwrite: bool) -> list[str]:
    """The files of ``out_dir`` an export may replace: none for a new or empty folder, and with
    ``overwrite`` those an earlier export listed in its manifest. Any other folder is refused, so
    nothing but our own files is ever removed (notes beside an export stay)."""
    if not out_dir.exists():
        return []
    if not out_dir.is_dir():
        raise ExportError(f"{out_dir}: exists and is not a directory")
    if not any(out_dir.iterdir()):
        return []
    files = earlier_export(out_dir)
    if files is None:
        raise ExportError(f"{out_dir}: exists and is not empty, and holds no export of taskformer's (no {MANIFEST} "
                          "listing the files it wrote); choose a new directory (nothing in it was changed)")
    if not overwrite:
        raise ExportExists(f"{out_dir}: already holds an export")
    folder = next((f for f in files if (out_dir / f).is_dir() and not (out_dir / f).is_symlink()), None)
    if folder:  # an export writes files only: a folder of that name is the user's
        raise ExportError(f"{out_dir / folder}: a folder, not a file the earlier export wrote (its {MANIFEST} lists "
                          "it); choose a new directory (nothing in it was changed)")
    return files


def _write_folder(out_dir: str | Path, overwrite: bool, build, tokenizer: Tokenizer, info: dict | None) -> Path:
    """Write an export into ``out_dir``: ``build(folder)`` fills a temporary folder beside it (CTranslate2's
    converter deletes the folder it writes to), ``tokenizer.json`` and the manifest join it, and each file
    is moved in by rename, replacing a link rather than writing through it. ``info`` is saved in the
    manifest ``taskformer.json`` with the names of the files written, so that the folder says where it
    came from and a later ``overwrite`` replaces exactly those."""
    from taskformer.core.checkpoint import write_json

    out_dir = Path(out_dir)
    earlier = _replaceable(out_dir, overwrite)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.export-"))
    except OSError as e:  # /proc, a read-only disk, a denied folder
        raise ExportError(f"{out_dir}: cannot write there ({e.strerror or e})") from None
    try:
        built = staging / "model"
        build(built)
        tokenizer.save(str(built / "tokenizer.json"))
        files = sorted(p.name for p in built.iterdir()) + [MANIFEST]
        write_json(built / MANIFEST, {**(info or {}), "files": files})
        theirs = [f for f in files if os.path.lexists(out_dir / f) and (f not in earlier or (out_dir / f).is_dir())]
        if theirs:
            raise ExportError(f"{out_dir / theirs[0]}: not written by the earlier export; choose a new directory "
                              "(nothing in it was changed)")
        for name in set(earlier) - set(files):
            (out_dir / name).unlink(missing_ok=True)
        for name in files:  # the manifest last: until it is replaced, the old one lists every name here
            os.replace(built / name, out_dir / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def to_ctranslate2(model: Transformer | Ensemble, tokenizer: Tokenizer, out_dir: str | Path, quantization: str = "float32",
                   overwrite: bool = False, info: dict | None = None) -> Path:
    """Write ``model`` as a CTranslate2 model in ``out_dir``, with ``tokenizer.json`` beside it and the
    manifest (see :func:`_write_folder`); ``quantization`` is CTranslate2's weight type (``int8`` etc.)."""
    import torch

    net = check_exportable(model)
    if quantization not in QUANTIZATIONS:
        raise ExportError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, not {quantization!r}")
    converter = _converter_class()(net.eval(), vocabulary(tokenizer, net.cfg.vocab_size))

    def build(folder: Path) -> None:
        with torch.no_grad():
            converter.convert(str(folder), quantization=quantization)

    return _write_folder(out_dir, overwrite, build, tokenizer, info)
