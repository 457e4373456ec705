"""Every call of a task's hooks, with the check of its answer.

The trainer in :mod:`taskformer.core.engine` never sees a task; these functions ask the task's
plugin for data, head, normalizer, decoder and metrics and hand the core plain tensors. Each checks
what the plugin handed back, so that a wrong answer is reported with the plugin, the hook and what
was expected, instead of surfacing later as an error deep inside the core.
"""
from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch
from tokenizers import Tokenizer

from taskformer.app import engines
from taskformer.app.resources import check_memory
from taskformer.core import decoding, inference, precision, progress, variants
from taskformer.core.config import RunConfig
from taskformer.core.data import (
    Encoded,
    TaskData,
    each_row,
    encode,
    encode_sources,
    encode_words,
    is_blank,
    is_pair,
    pad,
    rows,
)
from taskformer.core.decoding import Label
from taskformer.core.errors import TaskformerError
from taskformer.core.model import BOS, DEFAULT_HEADS, UNK, Ensemble, Transformer
from taskformer.core.precision import autocast
from taskformer.core.scoring import reference_logprobs
from taskformer.core.tokenize import check_specials
from taskformer.plugins.builtin import defaults as default_decoder
from taskformer.plugins.hookspecs import Output, Task
from taskformer.plugins.manager import PluginError, plugins
from taskformer.plugins.run import SPLITS, Prediction, Run


def build_model(task: Task, config: RunConfig, vocab_size: int, labels: list[str] | None,
                training: bool = False) -> Transformer | Ensemble:
    mc = replace(config.model, vocab_size=vocab_size, num_classes=len(labels) if labels else 0)
    check_memory(task, config, vocab_size, mc.num_classes, training=training)

    def network() -> Transformer:  # each ensemble member asks the plugin for a head of its own
        plugin, head = plugins().first("taskformer_head", task, model_config=mc)
        where = f"plugin {plugin!r}: taskformer_head for task {task.name!r}"
        if head is not None and not isinstance(head, torch.nn.Module):
            raise PluginError(f"{where} must return a torch.nn.Module, got {type(head).__name__}")
        model = Transformer(mc) if head is None else Transformer(mc, head)
        if head is not None:
            check_head(model, where)
        return model

    try:
        return network() if mc.members == 1 else Ensemble([network() for _ in range(mc.members)])
    except RuntimeError as e:
        if "allocate" not in str(e):
            raise
        raise TaskformerError(f"config: the model does not fit in memory (model.d_model={mc.d_model}, "
                              f"model.d_ff={mc.d_ff}, vocabulary {vocab_size}): {str(e).splitlines()[0][:200]}") from None


@torch.no_grad()
def check_head(model: Transformer, where: str) -> None:
    """Run a plugin's head once on a tiny batch: a wrong contract fails here, named, not mid-training."""
    src, tgt_in = torch.tensor([[BOS, UNK, UNK]]), torch.tensor([[BOS, UNK]])
    kind = model.cfg.kind
    expected = kind.logits_shape(1, src.size(1), tgt_in.size(1), model.cfg.vocab_size, model.cfg.num_classes)
    model.eval()  # no dropout: the check draws no random numbers
    try:
        shape: tuple[int, ...] | str = tuple((model(src, tgt_in) if kind.decoder else model(src)).shape)
    except Exception as e:
        shape = f"an error ({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})"
    finally:
        model.train()
    if shape != expected:
        raise PluginError(f"{where}: head(hidden, src_mask) must return logits of shape {expected} for this "
                          f"test batch, but gave {shape}")


def normalize(task: Task, texts: list, config: RunConfig) -> list:
    """Raw inputs through the task's ``taskformer_normalize`` (texts it leaves alone stay as they are);
    each text of a pair on its own."""
    def one(text: str) -> str:
        plugin, clean = plugins().first("taskformer_normalize", task, text=text, config=config)
        if clean is not None and not isinstance(clean, str):
            raise PluginError(f"plugin {plugin!r}: taskformer_normalize for task {task.name!r} must return a "
                              f"string, got {type(clean).__name__}")
        return text if clean is None else clean

    return [tuple(map(one, text)) if is_pair(text) else one(text) for text in texts]


def decode_texts(task: Task, model: Transformer | Ensemble, tokenizer: Tokenizer, labels, config: RunConfig,
                 texts: list, name: str = "decoding", purpose: str = "evaluate"):
    """Decode raw sources (texts, or a pair task's pairs of texts) through the task's decoder, batched
    by source length; blank inputs give blank outputs.

    Returns the predictions in input order and how many inputs were truncated to ``model.max_len``.
    A tagging task's decoder also receives where each word starts (``words``; ``None`` otherwise).
    ``purpose`` tells the decoder why: ``"evaluate"`` (a val or test evaluation) or ``"predict"`` (a user's inputs).
    Where ``decode.engine`` picks a runtime (:func:`engine_choice`), it decodes the batches instead of the
    task's decoder (a decoder-only batch whose continuation would pass the model's positions excepted).
    """
    kind, dc = model.cfg.kind, config.decode
    choice = engine_choice(task, model, config)
    device = engines.parameters(model)[0].device
    runtime = None if choice.engine == "torch" else engines.runtime(choice, model, tokenizer, dc)
    copies: list = []  # the torch model decodes where no runtime does: made on first use

    def network():  # a CPU copy: packed, or int8 (fp32 inputs); compiled where the outputs are searched
        if not copies:
            copies.append(inference.for_decoding(model.eval(), dc.quantize, dc.compile and kind.decoder))
        return copies[0]

    blank = Label("", 0.0) if kind.labelled and not kind.per_word else ""  # one type of answer per task
    outputs: list[Prediction] = [blank] * len(texts)
    # A language model continues even an empty prompt for a user (it starts from BOS); a blank source
    # of any other model, or an evaluation's empty prompt (running text), gives a blank prediction.
    todo = [i for i, t in enumerate(texts) if not is_blank(t) or (purpose == "predict" and not kind.encoder)]
    inputs = [texts[i] for i in todo]
    if kind.per_word:
        src, words, cut = encode_words(tokenizer, inputs, model.cfg.max_len)
    else:
        words = None
        src, cut = encode_sources(tokenizer, inputs, model.cfg.max_len, classify=kind.labelled, prompt=not kind.encoder)
    # A batch holds sources of one length. Padding changes a row's rounding (in bf16, its words), and a
    # sentence must decode to the same output alone, in eval's batches or beside a stranger's on a server.
    # Longest sources first: workers take batches in turn, and a long batch left for last would leave
    # the other workers idle while it runs.
    # CTranslate2 takes sources of any length in one batch (each row keeps its own budget): its chunks
    # are the longest-first order cut every decode.batch_size, so a server's mixed batch stays one batch.
    mixed = getattr(runtime, "mixes_lengths", False)
    chunks: list[list[int]] = []
    for _, group in itertools.groupby(sorted(range(len(todo)), key=lambda j: -len(src[j])),
                                      lambda j: 0 if mixed else len(src[j])):
        same = list(group)
        chunks += [same[start : start + dc.batch_size] for start in range(0, len(same), dc.batch_size)]

    def run(chunk: list[int]) -> list[Prediction]:
        ids = [src[j] for j in chunk]
        starts = None if words is None else [words[j] for j in chunk]
        if runtime is not None and runtime.fits(ids, dc):  # it reads the id rows: no padded tensor
            return engines.decode(runtime, ids, starts, labels, dc, tokenizer)
        batch = pad(ids).to(device)
        with autocast(config.train.bf16 if dc.quantize == "none" else False, device):
            plugin, outs = plugins().first("taskformer_decode", task, model=network(), src=batch, tokenizer=tokenizer,
                                           labels=labels, words=starts, config=config, purpose=purpose)
        wrong = "not a list" if not isinstance(outs, list) else (
            f"{len(outs)} for {len(chunk)} rows" if len(outs) != len(chunk) else
            next((f"{type(o).__name__} at row {i}" for i, o in enumerate(outs) if not isinstance(o, (str, Label))), ""))
        if wrong:
            raise PluginError(f"plugin {plugin!r}: taskformer_decode for task {task.name!r} must return one "
                              f"prediction (a str or a Label) per source row, got {wrong}")
        return outs

    workers = decoding.decode_workers(dc.workers, device, len(chunks))
    with progress.stage(name, len(todo)) as advance:
        for chunk, outs in zip(chunks, decoding.parallel_map(run, chunks, workers)):
            for j, out in zip(chunk, outs):
                outputs[todo[j]] = out
            advance(len(chunk))
    return outputs, cut


def score(task: Task, pairs: Sequence[tuple], hyps: list[Prediction], logprobs: list[list[float]] | None = None) -> dict:
    """Merge the metrics every plugin that hears this task reports."""
    merged: dict = {}
    for plugin, part in plugins().answers("taskformer_metrics", task, sources=[row[0] for row in pairs],
                                          hypotheses=hyps, references=[row[1] for row in pairs],
                                          fields=[row[2] if len(row) > 2 else {} for row in pairs],
                                          logprobs=logprobs if logprobs is not None else [[] for _ in pairs]):
        if not isinstance(part, dict):
            raise PluginError(f"plugin {plugin!r}: taskformer_metrics for task {task.name!r} must return a dict "
                              f"of metric name to number, got {type(part).__name__}")
        merged.update(part)
    return merged


def evaluate_split(run: Run, pairs: Sequence[tuple], config: RunConfig | None = None, name: str = "decoding",
                   encoded: Encoded | None = None):
    """Score the references and decode one split; returns (metrics, [(source, prediction, reference), ...]).

    The metrics hold ``loss``, the mean negative log-likelihood (nats) per scored reference token, from
    the per-token log-probabilities the metrics hook also receives. ``encoded`` is the split already
    encoded for the model (training encodes val once)."""
    config = config or run.config
    if encoded is None:
        encoded = encode(TaskData(run.tokenizer, {"split": pairs}, run.labels), "split", run.model.cfg.max_len,
                         run.model.cfg.variant)
    logprobs = reference_logprobs(run.model, encoded, len(pairs), config.train, run.device)
    count = sum(map(len, logprobs))
    loss = -sum(map(sum, logprobs)) / count if count else math.nan
    hyps, _ = decode_texts(run.task, run.model, run.tokenizer, run.labels, config, [row[0] for row in pairs], name)
    return {"loss": loss, **score(run.task, pairs, hyps, logprobs)}, [
        Output(row[0], h, row[1], row[2] if len(row) > 2 else None) for row, h in zip(pairs, hyps)]


def load_data(task: Task, config: RunConfig, data_dir: str | Path | None, splits=SPLITS,
              tokenizer: Tokenizer | None = None) -> TaskData:
    """The task's data, checked: a wrong answer is an error naming the plugin and what was expected.

    ``splits`` are the ones the caller uses (the hook may read only those); a saved run's
    ``tokenizer`` is handed to the hook and replaces whatever tokenizer it returns, so a saved run
    is always encoded the way it was trained.
    """
    plugin, data = plugins().first("taskformer_data", task, config=config, splits=tuple(splits), tokenizer=tokenizer,
                                   data_dir=Path(data_dir) if data_dir else None)
    where = f"plugin {plugin or task.plugin!r}: taskformer_data for task {task.name!r}"
    if not isinstance(data, TaskData):
        raise PluginError(f"{where} must return a TaskData, got {type(data).__name__}")
    missing = [s for s in splits if not data.splits.get(s)]
    if missing:  # most often the data is too small to split (one row of train.csv leaves no val): said as such
        counts = ", ".join(f"{s} {len(data.splits.get(s) or [])}" for s in SPLITS)
        given = f"the data in {data_dir}" if data_dir else "its data options"
        raise TaskformerError(f"task {task.name!r}: {given} gave no {', '.join(missing)} split (rows: {counts}); "
                              "give more rows, or change the option that made it empty (a size of 0, say)")
    if tokenizer is not None:
        data.tokenizer = tokenizer
    for split, held in data.splits.items():
        if split != "train" and not isinstance(held, list):  # decoded and scored as text: read now
            data.splits[split] = rows(held)

    def source(x) -> bool:  # a text, or for a task of pairs a tuple of two texts
        return is_pair(x) and len(x) == 2 and all(isinstance(t, str) for t in x) if task.pairs else isinstance(x, str)

    for split in splits:
        bad = next((i for i, row in enumerate(each_row(data.splits[split])) if not (
            isinstance(row, (tuple, list)) and len(row) in (2, 3) and source(row[0]) and isinstance(row[1], str)
            and (len(row) == 2 or isinstance(row[2], dict)))), None)
        if bad is not None:
            shape = "a tuple (first, second) of two strings (the task declares pairs)" if task.pairs else "a string"
            raise PluginError(f"{where}: {split} row {bad} must be a (source, target) pair or a (source, target, "
                              f"fields) triple with a dict, its source {shape} and its target a string, got "
                              f"{rows(data.splits[split], bad, bad + 1)[0]!r:.80}")
    try:
        check_specials(data.tokenizer)
    except ValueError as e:
        raise PluginError(f"{where}: {e} (see 'Bring your own tokenizer' in docs/plugins.md)") from None
    kind = variants.of(task.variant)
    if kind.labelled:
        check_labels(data, kind.per_word, where, splits)
    return data


def check_labels(data: TaskData, tagging: bool, where: str, splits=SPLITS) -> None:
    """Every target of a classifier is one of ``labels``; a tagger's is one of them per source word."""
    if not data.labels:
        raise PluginError(f"{where} must give the {'tag' if tagging else 'class'} names in TaskData.labels")
    known = set(data.labels)
    for split in splits:
        for i, (source, target, *_) in enumerate(each_row(data.splits[split])):
            tags = target.split() if tagging else [target]
            bad = next((t for t in tags if t not in known), None)
            if bad is not None:
                raise PluginError(f"{where}: {split} target {bad!r} is not one of its labels {data.labels!r:.120}")
            if tagging and len(tags) != len(source.split()):
                raise PluginError(f"{where}: {split} row {i} has {len(source.split())} words but {len(tags)} tags "
                                  f"(a tagging target is one label per whitespace-separated source word)")


def own_decoder(task: Task) -> str | None:
    """The plugin that decodes ``task`` with a search of its own (its ``taskformer_decode`` comes
    before the built-in default's), or None where the default decoder decodes it."""
    first, _ = next(iter(plugins().listeners("taskformer_decode", task)), ("", None))
    return first if first and first != default_decoder.__name__ else None


_choices: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (what its choice was made of, the choice)


def engine_choice(task: Task, model: Transformer | Ensemble, config: RunConfig) -> engines.Choice:
    """Which engine decodes ``task``'s ``model`` under ``config`` (``decode.engine``), and why: what
    ``predict --json``, ``eval --json``, the server and the report say.

    Remembered per model with everything it is made of that can change: the task, the decode options,
    the precision setting, the output head, the device, the plugins that hear ``taskformer_decode`` for
    the task and the runtimes' modules (:func:`engines.installed`). A call with all of them unchanged (a
    server's every batch) reuses it: making it anew cost about a tenth of a millisecond a call, cold
    after the runtime's own."""
    head = model.members[0].head if isinstance(model, Ensemble) else model.head
    device = engines.parameters(model)[0].device
    listening = plugins().listeners("taskformer_decode", task)  # own_decoder's answer comes from these

    def made_of() -> tuple:
        return task, config.decode, config.train.bf16, type(head), device, listening, engines.installed()

    kept = _choices.get(model)
    if kept is not None and kept[0] == made_of():
        return kept[1]
    own_head = None if type(head) is DEFAULT_HEADS[model.cfg.variant] else type(head).__name__
    facts = engines.Facts(task.variant, len(model.members) if isinstance(model, Ensemble) else 1, own_decoder(task),
                          own_head, device.type, model.cfg.max_len)
    bf16, _ = precision.choose(config.train.bf16, device)
    choice = engines.choose(config.decode.engine, facts, config.decode, bf16, engines.available(device.type))
    _choices[model] = (made_of(), choice)  # after available(), which may have imported a runtime
    return choice


def label_network(task: Task, model: Transformer | Ensemble, tokenizer: Tokenizer, config: RunConfig):
    """What computes a classifier's or tagger's logits under ``config``: ONNX Runtime's network where
    ``decode.engine`` picks it (called as our model is: ``network(src)``, on rows of one length), else ``model``."""
    choice = engine_choice(task, model, config)
    return model if choice.engine != "onnxruntime" else engines.runtime(choice, model, tokenizer, config.decode)
