"""Which engine decodes a run (``decode.engine``), and its converted model in the user's cache.

Our decoder (torch) decodes everything. CTranslate2 runs an encoder-decoder's or a language model's
whole search in C++, ONNX Runtime a classifier's or tagger's network, several times faster on a small
model, where eager PyTorch pays tens of microseconds an operation (docs/benchmarks.md). ``auto``
takes the runtime where it is installed and can decode what the run asks for, and says why not
otherwise: :func:`choose` is a pure function of the run's facts, the decode options and what is
installed, so every fallback is testable.

A runtime never reads a model from a run directory: the run's network is converted once into the
user's cache (``~/.cache/taskformer/engines/``, beside the data cache, moved by ``TASKFORMER_CACHE``),
keyed by the SHA-256 of its weights and tokenizer, the runtime, its version and the compute type. An
entry is built in a temporary folder and renamed into place, and records the SHA-256 of each of its
files: a damaged entry is rebuilt, not loaded. With ``TASKFORMER_CACHE=off`` the conversion goes to a
temporary folder that is removed once loaded. The newest :data:`KEEP` entries are kept.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import operator
import os
import shutil
import sys
import tempfile
import threading
import warnings
import weakref
from pathlib import Path
from typing import Any, NamedTuple, cast

import torch
from tokenizers import Tokenizer

from taskformer.app import datacache
from taskformer.core import variants
from taskformer.core.data import pad
from taskformer.core.decode_config import DecodeConfig
from taskformer.core.decoding import best_tags, decode_workers, labels_of
from taskformer.core.errors import TaskformerError
from taskformer.core.model import Ensemble, SequenceModel, Transformer
from taskformer.core.runtimes import CTranslate2Search, OnnxNetwork, context_fits

FORMAT = 6  # of a cache entry: a new format is a new key, so a change of what a conversion writes reuses no older entry
KEEP = 8  # cache entries kept, newest first
ENTRY = "entry.json"  # an entry's record: what it holds and each file's SHA-256, written last
INSTALL = "pip install taskformer[export]"
ONNX_PACKAGES = ("onnxruntime", "onnx", "onnxscript")  # the runtime, and what exports to it
CUBLAS = "libcublas.so.12"  # what CTranslate2 4's wheels (built with CUDA 12) open on their first GPU call


class EngineError(TaskformerError):
    """The engine asked for cannot decode this run as asked; the message says why."""


class Facts(NamedTuple):
    """What of a run decides which engines can decode it."""

    variant: str
    members: int  # model.members: an ensemble's networks
    own_decoder: str | None  # the plugin whose taskformer_decode searches instead of the default
    own_head: str | None  # the class of a plugin's output head, where it is not the variant's own
    device: str  # cpu or cuda
    positions: int = 0  # model.max_len: a language model's prompt and continuation must fit in them on CTranslate2 (context_fits)


class Choice(NamedTuple):
    """The engine that decodes, the runtime's compute type (``""`` for torch) and why."""

    engine: str
    compute_type: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"engine": self.engine, "compute_type": self.compute_type, "reason": self.reason}

    def __str__(self) -> str:
        return f"{self.engine}{f' {self.compute_type}' if self.compute_type else ''} ({self.reason})"


def cuda_usable(ctranslate2: Any) -> bool:
    """Whether CTranslate2 can decode on a GPU here: it sees one, and the cuBLAS it opens on its first
    GPU call loads (a process whose torch brings another CUDA's cuBLAS has none: CTranslate2 would
    fail at the first sentence, after ``auto`` had chosen it)."""
    if ctranslate2.get_cuda_device_count() < 1:
        return False
    try:
        ctypes.CDLL(CUBLAS)
    except OSError:
        return False
    return True


def available(device: str) -> dict[str, frozenset[str]]:
    """The runtimes installed here that can run on ``device``, each with the compute types it offers there."""
    found: dict[str, frozenset[str]] = {}
    try:
        import ctranslate2
        if device == "cpu" or cuda_usable(ctranslate2):
            found["ctranslate2"] = frozenset(ctranslate2.get_supported_compute_types(device))
    except ImportError:
        pass
    try:
        for name in ONNX_PACKAGES:
            __import__(name)
        import onnxruntime
        if device == "cpu" or "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            found["onnxruntime"] = frozenset({"float32", "int8"})
    except ImportError:
        pass
    return found


def installed() -> tuple:
    """What :func:`available` finds that can change within a process: the runtimes' modules as imported
    (one put into or taken out of ``sys.modules``). A remembered choice is made anew when it changes."""
    return tuple(map(sys.modules.get, ("ctranslate2", *ONNX_PACKAGES)))


def runtime_of(variant: str) -> str:
    """The runtime that can decode a variant: CTranslate2 a search, ONNX Runtime a network's logits."""
    return "ctranslate2" if variants.of(variant).decoder else "onnxruntime"


def obstacle(runtime: str, facts: Facts, decode: DecodeConfig, found: dict[str, frozenset[str]]) -> str | None:
    """Why ``runtime`` cannot decode this run as asked, or None where it can."""
    what = "CTranslate2" if runtime == "ctranslate2" else "ONNX Runtime"
    if facts.members > 1:
        return f"the run is an ensemble of {facts.members} networks (model.members); {what} runs one network"
    if facts.own_decoder:
        return (f"task decoded by plugin {facts.own_decoder!r}'s own search (its taskformer_decode hook: a constraint "
                f"or rules of its own); {what} runs the plain search")
    if facts.own_head and runtime == "ctranslate2":
        return f"the task's plugin gives the model its own output head ({facts.own_head}); CTranslate2 has only a linear one"
    if decode.compile:
        return "decode.compile=true asks for our compiled decoding step"
    if runtime == "ctranslate2" and decode.no_repeat_ngram:
        return "decode.no_repeat_ngram is our search's rule (the prompt's n-grams count too)"
    if (runtime == "ctranslate2" and not variants.of(facts.variant).encoder and facts.positions > 0
            and not context_fits(1, decode.max_new_tokens, facts.positions)):  # not even a one-token prompt
        return (f"decode.max_new_tokens={decode.max_new_tokens} leaves no room for a prompt in the model's "
                f"{facts.positions} positions (model.max_len); CTranslate2 cannot slide the context as our decoder does")
    if runtime not in found:
        if facts.device == "cuda":
            needs = f"; CTranslate2 needs {CUBLAS}" if runtime == "ctranslate2" else ""
            return f"{runtime} with CUDA is not installed, or cannot use this GPU ({INSTALL}{needs})"
        return f"{runtime} is not installed ({INSTALL})"
    return None


def compute_type(runtime: str, decode: DecodeConfig, bf16: bool, offered: frozenset[str]) -> tuple[str, str]:
    """The runtime's compute type for ``decode.quantize`` and the run's precision (``bf16``: ours decodes in
    bf16 here), and a note where it is not the one asked for."""
    if decode.quantize == "int8":
        return ("int8", "") if "int8" in offered else ("float32", f"; fp32: {runtime} offers no int8 here")
    if bf16 and runtime == "ctranslate2":
        return ("bfloat16", "") if "bfloat16" in offered else (
            "float32", "; fp32: this CTranslate2 build has no bf16 here, where our decoder would use bf16")
    if bf16:  # its labels equal our fp32 network's; bf16's may differ where two labels score almost alike
        return "float32", "; fp32: ONNX Runtime runs the exported fp32 network, where our decoder would use bf16"
    return "float32", ""


def choose(asked: str, facts: Facts, decode: DecodeConfig, bf16: bool, found: dict[str, frozenset[str]]) -> Choice:
    """The engine that decodes: ``asked`` (``decode.engine``) for a run of ``facts`` with the options
    ``decode`` (in ``bf16`` where ours would be), given the runtimes ``found`` (:func:`available`).

    ``auto`` falls back to torch with the reason; an engine asked for by name that cannot decode the
    run is refused (:class:`EngineError`), never swapped for another."""
    if asked == "torch":
        return Choice("torch", "", "decode.engine=torch")
    runtime = runtime_of(facts.variant)
    if asked not in ("auto", runtime):
        runs = "classifiers and taggers" if asked == "onnxruntime" else "encoder-decoder and decoder-only runs"
        raise EngineError(f"decode.engine={asked}: it decodes {runs}, and this run is {facts.variant}; use {runtime}, "
                          "torch or auto")
    why_not = obstacle(runtime, facts, decode, found)
    if why_not is None and asked == "auto" and runtime == "ctranslate2" and decode.temperature > 0:
        why_not = ("sampling: decode.seed gives an input the same output whatever came before it, which CTranslate2's "
                   "per-thread random generators do not (decode.engine=ctranslate2 samples there anyway)")
    if why_not is not None:
        if asked == "auto":
            return Choice("torch", "", f"auto: {why_not}")
        raise EngineError(f"decode.engine={asked}: {why_not}")
    compute, note = compute_type(runtime, decode, bf16, found[runtime])
    what = "this network and its search" if variants.of(facts.variant).decoder else "this network"
    if runtime == "ctranslate2" and not variants.of(facts.variant).encoder:
        note += (f"; a prompt whose continuation would pass model.max_len ({facts.positions}) is continued by our "
                 "decoder, which slides the context")
    return Choice(runtime, compute, f"{'auto: ' if asked == 'auto' else ''}{runtime} is installed and runs {what}{note}")


# --- the converted model, in the user's cache -------------------------------------------------------------


def root() -> Path | None:
    """The engines' cache folder, beside the data cache; None when caching is off."""
    data = datacache.root()
    return None if data is None else data.parent / "engines"


_digests: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (parameter versions, digest)
_loaded: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (key, runtime)
_parameters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its parameters
_lock = threading.Lock()
_VERSION = operator.attrgetter("_version")  # a tensor's in-place change counter


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of the model's weights (names, types, shapes and bytes), once per set of weights."""
    versions = tuple(p._version for p in model.parameters())
    kept = _digests.get(model)
    if kept is not None and kept[0] == versions:
        return kept[1]
    digest = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    _digests[model] = (versions, digest.hexdigest())
    return digest.hexdigest()


def _version(runtime: str) -> str:
    return __import__(runtime).__version__


def entry_key(choice: Choice, model: torch.nn.Module, tokenizer: Tokenizer) -> str:
    parts = [FORMAT, choice.engine, _version(choice.engine), choice.compute_type, weights_digest(model),
             hashlib.sha256(tokenizer.to_str().encode()).hexdigest()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def whole(folder: Path) -> bool:
    """Whether a cache entry is there and every file it records has its recorded SHA-256."""
    try:
        if folder.is_symlink() or not folder.is_dir():
            return False
        files = json.loads((folder / ENTRY).read_text())["files"]
        return all(not (folder / n).is_symlink() and _file_sha256(folder / n) == h for n, h in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def convert(choice: Choice, model: Transformer, tokenizer: Tokenizer, folder: Path) -> None:
    """Write the runtime's model into the new folder ``folder``, with its record (:data:`ENTRY`)."""
    if choice.engine == "ctranslate2":
        from taskformer.core import export

        export.to_ctranslate2(model, tokenizer, folder, choice.compute_type)
    else:
        from taskformer.core import onnx_export

        folder.mkdir()  # the graph for batches of one length, as decode_texts hands them (onnx_export.for_engine)
        if choice.compute_type == "int8":
            onnx_export.build(model, folder / "fp32.onnx", engine=True)
            onnx_export.quantized(folder / "fp32.onnx", folder / onnx_export.MODEL)
            (folder / "fp32.onnx").unlink()
        else:
            onnx_export.build(model, folder / onnx_export.MODEL, engine=True)
    files = {p.name: _file_sha256(p) for p in sorted(folder.iterdir())}
    (folder / ENTRY).write_text(json.dumps({"format": FORMAT, **choice.as_dict(), "weights": weights_digest(model),
                                            "files": files}, indent=1))


def cached(choice: Choice, model: Transformer, tokenizer: Tokenizer, base: Path) -> Path:
    """The entry of ``model`` for ``choice`` under ``base``: reused where whole, else (re)built."""
    folder = base / entry_key(choice, model, tokenizer)
    if whole(folder):
        os.utime(folder)  # the newest entries are kept
        return folder
    base.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=base, prefix=".building-"))
    try:
        convert(choice, model, tokenizer, building / "entry")
        if folder.is_symlink():
            folder.unlink()
        elif folder.exists():  # damaged: a file missing or changed, an interrupted write of an older version
            shutil.rmtree(folder)
        try:
            os.rename(building / "entry", folder)
        except OSError:  # another process put its entry there first: use it
            if not whole(folder):
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    prune(base)
    return folder


def prune(base: Path, keep: int = KEEP) -> None:
    entries = sorted((p for p in base.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def parameters(model: torch.nn.Module) -> tuple[torch.nn.Parameter, ...]:
    """``model``'s parameters, listed once: walking the modules for them costs more than a small
    classifier's batch, and a server asks for every batch. A module keeps its parameter objects for
    its life here (moved, loaded and updated in place)."""
    params = _parameters.get(model)
    if params is None:
        params = _parameters[model] = tuple(model.parameters())
    return params


def runtime(choice: Choice, model: Transformer | Ensemble, tokenizer: Tokenizer, decode: DecodeConfig) -> Any:
    """The loaded runtime of ``choice`` for ``model`` (its :class:`CTranslate2Search` or :class:`OnnxNetwork`),
    converted through the cache on first use and kept while the weights are unchanged; CTranslate2 gets
    as many workers as our decoder would run (``decode.workers``)."""
    net = cast(Transformer, model)
    params = parameters(net)
    device = params[0].device.type
    workers = decode_workers(decode.workers, params[0].device, 1 << 20)
    # The same weights (their version counters, bumped by every in-place change: an update, a
    # load_state_dict), choice, tokenizer and workers: the loaded runtime, with no digest computed (a
    # server asks for every batch).
    key = (choice, workers, id(tokenizer), tuple(map(_VERSION, params)))
    kept = _loaded.get(net)
    if kept is not None and kept[0] == key:
        return kept[1]
    with _lock:
        kept = _loaded.get(net)
        if kept is not None and kept[0] == key:  # another thread loaded it meanwhile
            return kept[1]
        base = root()
        with tempfile.TemporaryDirectory(prefix="taskformer-engine-") as scratch:  # the cache is off: loaded, then gone
            folder = None
            if base is not None:
                try:
                    folder = cached(choice, net, tokenizer, base)
                except OSError as e:  # a cache that cannot be written costs the conversion's time, never the run
                    warnings.warn(f"engine cache: cannot use {base} ({datacache.reason(e)}); the converted model "
                                  "is not kept", stacklevel=2)
            if folder is None:
                folder = Path(scratch) / "entry"
                convert(choice, net, tokenizer, folder)
            if choice.engine == "ctranslate2":
                from taskformer.core.export import vocabulary

                loaded: Any = CTranslate2Search(folder, net.cfg.kind, vocabulary(tokenizer, net.cfg.vocab_size),
                                                net.cfg.max_len, device, choice.compute_type, workers)
            else:
                from taskformer.core.onnx_export import MODEL

                loaded = OnnxNetwork(folder / MODEL, net.cfg, device, workers)
        _loaded[net] = (key, loaded)
        return loaded


def decode(loaded: Any, src: list[list[int]], words: list[list[int]] | None, labels: list[str] | None,
           config: DecodeConfig, tokenizer: Tokenizer) -> list:
    """What the default decoder gives for the id rows ``src`` (unpadded), from the runtime: texts, labels or tags."""
    if isinstance(loaded, CTranslate2Search):
        return [tokenizer.decode(ids) for ids in loaded.search(src, config)]
    net = cast(OnnxNetwork, loaded)
    if net.cfg.kind.per_word:
        return best_tags(cast(SequenceModel, net), pad(src), words or [], labels or [])
    return labels_of(net.probabilities(src), labels or [])
