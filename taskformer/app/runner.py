"""Glue between the hooks and the core: build a task's model, train, evaluate, predict, report.

The trainer in :mod:`taskformer.core.engine` never sees a task; this module asks the task's
plugin for data, head and decoder through the hooks and hands the core plain tensors. It also
checks what the plugins hand back, so that a wrong answer is reported with the plugin, the hook and
what was expected instead of surfacing later as an error deep inside the core.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import shutil
import signal
import time
import warnings
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer

from taskformer.core import checkpoint as ckpt
from taskformer.core import compat
from taskformer.core import config as C
from taskformer.core import decoding
from taskformer.core import export as export_model
from taskformer.core import precision
from taskformer.core import progress
from taskformer.core import variants
from taskformer.core import quantize
from taskformer.core.config import RunConfig
from taskformer.core.data import TaskData, encode, encode_sources, encode_words, pad
from taskformer.core.decoding import Label
from taskformer.core.engine import Trainer, autocast, evaluate_loss
from taskformer.core.errors import TaskformerError
from taskformer.core.model import BOS, UNK, Ensemble, Transformer
from taskformer.core.tokenize import check_specials
from taskformer.plugins.builtin import defaults as default_decoder
from taskformer.plugins.hookspecs import Output, Task
from taskformer.plugins.manager import PluginError, plugins
from taskformer.app.resources import check_memory, pick_device, use_threads
from taskformer.app.resources import keep_freed_memory  # noqa: F401 -- tests and bench/allocator.py import it from here

SPLITS = ("train", "val", "test")
Prediction = str | Label  # what a decode hook returns per row


def spread(items: list, n: int = 5) -> list:
    """``n`` items evenly spaced over the list (report samples that are not all from the start)."""
    return items[:: max(1, len(items) // n)][:n]


@dataclass
class Run:
    """Everything known about one run; report sections and commands read from it."""

    dir: Path
    task: Task
    config: RunConfig
    tokenizer: Tokenizer
    labels: list[str] | None
    model: Transformer
    metrics: dict[str, dict] = field(default_factory=dict)  # split -> metric -> value
    # split -> every (source, prediction, reference) of the split
    outputs: dict[str, list[tuple[str, Prediction, str]]] = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # data sizes, wall time, throughput, notes

    @property
    def samples(self) -> dict[str, list[tuple[str, Prediction, str]]]:
        """A few outputs of each split, evenly spread: what the report shows as samples."""
        return {split: spread(rows) for split, rows in self.outputs.items()}

    @property
    def history(self) -> list[dict]:
        path = self.dir / "metrics.jsonl"
        return ckpt.read_jsonl(path) if path.exists() else []

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def make_config(task: Task, config_file: str | None, overrides: list[str], seed: int | None) -> RunConfig:
    cfg = C.defaults(task)
    if config_file:
        C.merge(cfg, C.read_config_file(config_file), str(config_file))
    C.merge(cfg, C.parse_overrides(overrides), "--set")
    if seed is not None:
        C.merge(cfg, {"train": {"seed": seed}}, "--seed")
    return C.build(task, cfg)


def saved_config(task: Task, saved: dict, source: str) -> RunConfig:
    """A run's config.json section; options added since it was written take their defaults."""
    return C.build(task, C.merge(C.defaults(task), saved, source))


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
        shape = tuple((model(src, tgt_in) if kind.decoder else model(src)).shape)
    except Exception as e:
        shape = f"an error ({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})"
    finally:
        model.train()
    if shape != expected:
        raise PluginError(f"{where}: head(hidden, src_mask) must return logits of shape {expected} for this "
                          f"test batch, but gave {shape}")


def normalize(task: Task, texts: list[str]) -> list[str]:
    """Raw input lines through the task's ``taskformer_normalize`` (lines it leaves alone stay as they are)."""
    out = []
    for text in texts:
        plugin, clean = plugins().first("taskformer_normalize", task, text=text)
        if clean is not None and not isinstance(clean, str):
            raise PluginError(f"plugin {plugin!r}: taskformer_normalize for task {task.name!r} must return a "
                              f"string, got {type(clean).__name__}")
        out.append(text if clean is None else clean)
    return out


def decode_texts(task: Task, model: Transformer, tokenizer: Tokenizer, labels, config: RunConfig,
                 texts: list[str], name: str = "decoding"):
    """Decode raw source lines through the task's decoder, batched by source length; blank lines give blank outputs.

    Returns the predictions in input order and how many inputs were truncated to ``model.max_len``.
    A tagging task's decoder also receives where each word starts (``words``; ``None`` otherwise).
    """
    model = quantize.for_decoding(model.eval(), config.decode.quantize)  # int8: a CPU copy, fp32 inputs
    kind = model.cfg.kind
    blank = Label("", 0.0) if kind.labelled and not kind.per_word else ""  # one type of answer per task
    outputs: list[Prediction] = [blank] * len(texts)
    todo = [i for i, t in enumerate(texts) if t.strip()]
    inputs = [texts[i] for i in todo]
    if kind.per_word:
        src, words, cut = encode_words(tokenizer, inputs, model.cfg.max_len)
    else:
        words = None
        src, cut = encode_sources(tokenizer, inputs, model.cfg.max_len, classify=kind.labelled)
    dc, device = config.decode, next(model.parameters()).device
    # A batch holds sources of one length. Padding changes a row's rounding (in bf16, its words), and a
    # sentence must decode to the same output alone, in eval's batches or beside a stranger's on a server.
    chunks = []
    for _, same in itertools.groupby(sorted(range(len(todo)), key=lambda j: len(src[j])), lambda j: len(src[j])):
        same = list(same)
        chunks += [same[start : start + dc.batch_size] for start in range(0, len(same), dc.batch_size)]

    def run(chunk: list[int]) -> list[Prediction]:
        batch = pad([src[j] for j in chunk]).to(device)
        starts = None if words is None else [words[j] for j in chunk]
        with autocast(config.train.bf16 if dc.quantize == "none" else False, device):
            plugin, outs = plugins().first("taskformer_decode", task, model=model, src=batch, tokenizer=tokenizer,
                                           labels=labels, words=starts, config=config)
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


def predict(run: Run, lines: list[str], config: RunConfig | None = None, return_attention: bool = False):
    """Predictions for raw input lines (normalized by the task first) and how many were truncated.

    The command line, :meth:`taskformer.Model.predict` and ``taskformer serve`` all decode here. With
    ``return_attention`` (encoder-decoder runs) each prediction comes as ``(prediction, Attention)``,
    the attention ``None`` for a blank line.
    """
    config = config or run.config
    if return_attention and run.task.variant != "encoder-decoder":
        raise TaskformerError(f"return_attention is for encoder-decoder models; task {run.task.name!r} is "
                              f"{run.task.variant}")
    sources = normalize(run.task, lines)
    outputs, cut = decode_texts(run.task, run.model, run.tokenizer, run.labels, config, sources)
    if return_attention:
        with autocast(config.train.bf16, run.device):
            outputs = [(out, decoding.cross_attention_map(run.model, run.tokenizer, src, str(out)) if src.strip()
                        else None) for src, out in zip(sources, outputs)]
    return outputs, cut


def with_search(config: RunConfig, beam: int | None = None, batch_size: int | None = None) -> RunConfig:
    """``config`` with another beam size (1 = greedy) or decoding batch size, as predict's options ask."""
    decode = config.decode
    if beam is not None:
        if not isinstance(beam, int) or isinstance(beam, bool) or beam < 1:
            raise TaskformerError(f"beam must be a whole number of at least 1, got {beam!r}")
        decode = replace(decode, strategy="beam" if beam > 1 else "greedy", beam=beam)
    if batch_size is not None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise TaskformerError(f"batch_size must be a whole number of at least 1, got {batch_size!r}")
        decode = replace(decode, batch_size=batch_size)
    return replace(config, decode=decode)


def set_decoding(run: Run, overrides: list[str], command: str) -> None:
    """Apply ``--set decode.KEY=VALUE`` to a loaded run's configuration; other sections are refused
    (``command`` names the command in the message)."""
    updates = C.parse_overrides(list(overrides))
    if other := sorted(f"{section}.{key}" for section in set(updates) - {"decode"} for key in updates[section]):
        raise TaskformerError(f"{command} --set changes decoding only, not {', '.join(other)}: use decode.KEY=VALUE")
    run.config = C.build(run.task, C.merge(run.config.to_dict(), updates, "--set"))


def evaluate_saved(run: Run, splits, data_dir: str | Path | None = None) -> dict[str, dict]:
    """Metrics of a loaded run on each of ``splits``, reading the data the run was trained on by default."""
    unknown = [s for s in splits if s not in ("val", "test")]
    if unknown:
        raise TaskformerError(f"unknown split {unknown[0]!r}: evaluate val or test")
    if data_dir is None:
        data_dir = ckpt.read_json(run.dir / "config.json").get("data_dir")
    data = load_data(run.task, run.config, data_dir, splits, run.tokenizer)  # the splits scored, nothing more
    return {s: evaluate_split(run, data.splits[s], name=f"decoding {s}")[0] for s in splits}


def own_decoder(task: Task) -> str | None:
    """The plugin that decodes ``task`` with a search of its own (its ``taskformer_decode`` comes
    before the built-in default's), or None where the default decoder decodes it."""
    first, _ = next(iter(plugins().listeners("taskformer_decode", task)), ("", None))
    return first if first and first != default_decoder.__name__ else None


def export(run: Run, out_dir: str | Path, quantization: str, overwrite: bool = False, force: bool = False) -> None:
    """Write the run's network for CTranslate2 (core/export.py), with a manifest of where it came from.

    Only the network and plain greedy or beam search travel: a task whose plugin decodes by its own
    rules (couplet's form constraint) would give other outputs there, so it is refused unless ``force``.
    """
    export_model.check_exportable(run.model)
    if own_decoder(run.task):
        why = (f"task {run.task.name!r} is decoded by its plugin's own search (taskformer_decode hook, e.g. a "
               "constrained one); CTranslate2 runs plain greedy/beam search, so its outputs would differ from "
               "`taskformer predict`")
        if not force:
            raise TaskformerError(f"{why}; pass --force to export the network anyway")
        warnings.warn(why)
    info = {"task": run.task.name, "run_dir": str(run.dir), "quantization": quantization,
            "max_input_length": run.model.cfg.max_len, "decode": run.config.to_dict()["decode"]}
    export_model.to_ctranslate2(run.model, run.tokenizer, out_dir, quantization, overwrite, info)


def use_average(run: Run, n: int) -> str:
    """Load the mean of the run's last ``n`` evaluated weights into its model; returns what they are."""
    kept = ckpt.evaluated_weights(run.dir)
    if len(kept) < n:
        raise TaskformerError(f"{run.dir}: averaging the last {n} checkpoints needs their weights, but the run kept "
                              f"{len(kept)} (train.average_last={n} or more keeps them)")
    steps = list(kept)[-n:]
    ckpt.load_average(run.model, [kept[s] for s in steps])
    return ckpt.weights_name(steps)


def score(task: Task, pairs: list[tuple], hyps: list[Prediction]) -> dict:
    """Merge the metrics every plugin that hears this task reports."""
    merged: dict = {}
    for plugin, part in plugins().answers("taskformer_metrics", task, sources=[row[0] for row in pairs],
                                          hypotheses=hyps, references=[row[1] for row in pairs],
                                          fields=[row[2] if len(row) > 2 else {} for row in pairs]):
        if not isinstance(part, dict):
            raise PluginError(f"plugin {plugin!r}: taskformer_metrics for task {task.name!r} must return a dict "
                              f"of metric name to number, got {type(part).__name__}")
        merged.update(part)
    return merged


def evaluate_split(run: Run, pairs: list[tuple[str, str]], config: RunConfig | None = None, name: str = "decoding"):
    """Decode and score one split; returns (metrics, [(source, prediction, reference), ...])."""
    hyps, _ = decode_texts(run.task, run.model, run.tokenizer, run.labels, config or run.config,
                           [row[0] for row in pairs], name)
    return score(run.task, pairs, hyps), [Output(row[0], h, row[1], row[2] if len(row) > 2 else None)
                                          for row, h in zip(pairs, hyps)]


def load_data(task: Task, config: RunConfig, data_dir: str | None, splits=SPLITS,
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
    if missing:
        raise PluginError(f"{where} returned no {', '.join(missing)} split (if a data option or file made it "
                          "empty, e.g. a size of 0, change that)")
    if tokenizer is not None:
        data.tokenizer = tokenizer
    for split in splits:
        bad = next((i for i, row in enumerate(data.splits[split]) if not (
            isinstance(row, (tuple, list)) and len(row) in (2, 3) and all(isinstance(x, str) for x in row[:2])
            and (len(row) == 2 or isinstance(row[2], dict)))), None)
        if bad is not None:
            raise PluginError(f"{where}: {split} row {bad} must be a (source, target) pair of strings or a "
                              f"(source, target, fields) triple with a dict, got {data.splits[split][bad]!r:.80}")
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
        for i, (source, target, *_) in enumerate(data.splits[split]):
            tags = target.split() if tagging else [target]
            bad = next((t for t in tags if t not in known), None)
            if bad is not None:
                raise PluginError(f"{where}: {split} target {bad!r} is not one of its labels {data.labels!r:.120}")
            if tagging and len(tags) != len(source.split()):
                raise PluginError(f"{where}: {split} row {i} has {len(source.split())} words but {len(tags)} tags "
                                  f"(a tagging target is one label per whitespace-separated source word)")


def default_run_dir(task: str) -> Path:
    """A new, empty ``runs/TASK/<time>``; runs started in the same second get ``<time>-2``, ``-3``, ...
    The directory is created here, exclusively, so two processes can never be handed the same one."""
    stamp = Path("runs") / task / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    make_dir(stamp.parent, exist_ok=True)
    for n in itertools.count(1):
        path = stamp if n == 1 else stamp.with_name(f"{stamp.name}-{n}")
        if make_dir(path, exist_ok=False):
            return path


def make_dir(path: Path, exist_ok: bool) -> bool:
    """mkdir -p; False if ``path`` already existed (and ``exist_ok``), an Error line if it cannot be made."""
    try:
        path.mkdir(parents=True, exist_ok=exist_ok)
        return True
    except FileExistsError:
        if path.is_dir():
            return False
        raise TaskformerError(f"{path}: exists and is not a directory") from None
    except OSError as e:
        raise TaskformerError(f"{path}: cannot create the run directory ({e.strerror})") from None


STARTED = {ckpt.MARKER, "config.json", "tokenizer.json", "metrics.jsonl", "checkpoints"}  # written before a checkpoint


def failed_before_checkpoint(path: Path) -> list[Path] | None:
    """What a run that stopped before its first checkpoint left in ``path`` (it cannot be resumed, so
    a new run may replace it), or None if ``path`` holds anything else. That is :data:`STARTED`, the
    best weights of its first evaluation beside its config.json, and temporary files of writes that
    were cut short."""
    ours = STARTED | ({ckpt.WEIGHTS} if (path / "config.json").is_file() else set())
    temporary = tuple(f".{name}." for name in ours)  # atomic_write's names: .NAME.<random>.tmp
    entries = list(path.iterdir())
    left = [p for p in entries if p.name in ours or (p.name.startswith(temporary) and p.name.endswith(".tmp"))]
    if len(left) < len(entries) or ckpt.latest_training_state(path / "checkpoints"):
        return None
    return left


def holds_run(path: Path) -> bool:
    """Whether ``path`` is a taskformer run: it carries our marker, or (runs written before the marker)
    a taskformer config.json recording a run id. Only a marked run is ever cleared."""
    if ckpt.run_mark(path):
        return True
    try:
        binding = read_run_config(path).get("binding")
    except TaskformerError:
        return False
    return isinstance(binding, dict) and isinstance(binding.get("run"), str)


def new_run_dir(task: str, out: str | None, lock: ExitStack) -> Path:
    """The run directory, created, locked for this process (see :func:`checkpoint.locked`) and
    marked as ours (:func:`checkpoint.mark_run`). ``--out`` may name a new or empty folder, or a
    marked run that stopped before its first checkpoint (it starts afresh); anything else is refused
    with nothing in it changed: a folder is never cleared because its files look like a run's."""
    path = Path(out) if out else default_run_dir(task)
    make_dir(path, exist_ok=True)
    lock.enter_context(ckpt.locked(path))
    for left in (failed_before_checkpoint(path) or []) if ckpt.run_mark(path) else []:  # start afresh
        if left.is_dir() and not left.is_symlink():
            shutil.rmtree(left)
        else:
            left.unlink()
    if holds_run(path):
        raise TaskformerError(f"{path} already holds a run; choose another --out or resume it with --resume {path} "
                              "(nothing in it was changed)")
    if any(path.iterdir()):
        raise TaskformerError(f"{path} is not empty and holds no taskformer run; --out must name a new or empty "
                              "folder (nothing in it was changed)")
    ckpt.mark_run(path)
    return path


@contextmanager
def stop_on_signals(trainer: Trainer, task: str):
    """SIGINT/SIGTERM finish the current step, checkpoint, and end training (instead of losing it).

    During a validation, which can take long, the first signal drops it where it is (parallel
    decoding workers finish the batch they hold) and saves nothing: the run resumes from its last
    checkpoint, redoing the updates since, exactly as after a kill. A second signal stops at once:
    checkpoints are written atomically, so the last one stays intact.
    """
    def handler(signum, frame):
        if trainer.stop_reason:
            raise KeyboardInterrupt
        trainer.stop_reason = f"interrupted by {signal.Signals(signum).name}"
        if trainer.validating:
            raise Interrupted(trainer.run_dir, f"{trainer.stop_reason} during validation", task, saved=False)
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def train(task_name: str, data_dir: str | None = None, out: str | None = None, time_limit: float | None = None,
          seed: int | None = None, config_file: str | None = None, overrides: tuple[str, ...] = (),
          resume: str | None = None, on_event=lambda e: None, shard: tuple[int, int] = (0, 1)) -> Run:
    """Train a task end to end (or continue ``resume``); returns the run with val/test metrics filled in.

    ``on_event`` receives the training events and the progress of every other stage (see core.progress).
    """
    with progress.listening(on_event), ExitStack() as lock:  # the run directory stays locked until we return
        try:
            return _train(task_name, data_dir, out, time_limit, seed, config_file, overrides, resume, on_event, shard,
                          lock)
        except ckpt.RunDirBusy as e:
            raise TaskformerError(f"{e}; wait for it to end or choose another --out") from None


def _train(task_name, data_dir, out, time_limit, seed, config_file, overrides, resume, on_event, shard, lock) -> Run:
    if resume:
        run_dir = Path(resume)
        if not run_dir.is_dir():
            raise TaskformerError(f"{run_dir}: no such run directory")
        if shard[0] == 0:
            lock.enter_context(ckpt.locked(run_dir))
        if (run_dir / "result.json").exists():
            raise TaskformerError(f"{run_dir} has finished (result.json exists): nothing to resume; "
                                  "start a new run to train longer")
        saved = read_run_config(run_dir)
        pin_precision(saved, run_dir)
        task = plugins().task(saved["task"])
        config = saved_config(task, saved["config"], str(run_dir / "config.json"))
        data_dir, time_limit = saved.get("data_dir"), saved.get("time_limit")
        stamp, tokenizer = bound_files(run_dir, saved), read_tokenizer(run_dir)
    else:
        task = plugins().task(task_name)
        config = make_config(task, config_file, list(overrides), seed)
        stamp, tokenizer = None, None
        footprint = getattr(config.data, "footprint", None)  # data made from options: can it be made here?
        if footprint:
            check_memory(task, config, **footprint())
        run_dir = new_run_dir(task.name, out, lock) if shard[0] == 0 else None
        if shard[1] > 1:  # every rank writes to (or reads) the directory rank 0 chose
            shared = [run_dir]
            torch.distributed.broadcast_object_list(shared, src=0)
            run_dir = shared[0]
    started = time.monotonic()
    use_threads(config)
    with progress.stage("loading data and training the tokenizer"):
        data = load_data(task, config, data_dir, tokenizer=tokenizer)
    device = pick_device()
    torch.manual_seed(config.train.seed)
    model = build_model(task, config, data.tokenizer.get_vocab_size(), data.labels, training=True).to(device)
    if not resume and shard[0] == 0:
        ckpt.atomic_write(run_dir / "tokenizer.json", data.tokenizer.to_str(pretty=True))
        binding = {"run": ckpt.run_mark(run_dir), "tokenizer_sha256": ckpt.sha256(run_dir / "tokenizer.json")}
        stamp = {"task": task.name, **binding}
        ckpt.write_json(run_dir / "config.json", {"task": task.name, "labels": data.labels,
                                                   "config": config.to_dict(), "data_dir": data_dir,
                                                   "time_limit": time_limit, "binding": binding,
                                                   "precision": precision_record(device)})
    with progress.stage("encoding the train and val splits"):
        train_enc, val_enc = (encode(data, s, config.model.max_len, task.variant) for s in ("train", "val"))
    run = Run(run_dir, task, config, data.tokenizer, data.labels, model)
    eval_config = replace(config, decode=replace(config.decode, strategy=config.decode.eval_strategy))

    def evaluate() -> dict:
        metrics, _ = evaluate_split(run, data.splits["val"], eval_config, "validating")
        return {"loss": evaluate_loss(model, val_enc, config.train, device), **metrics}

    trainer = Trainer(model, config.train, train_enc, evaluate, (task.metric, task.higher_is_better), run_dir, device,
                      on_event=on_event, shard=shard, stamp=stamp)
    latest = ckpt.latest_training_state(run_dir / "checkpoints") if resume else None
    if latest and stamp:
        ckpt.check_stamp(latest / ckpt.WEIGHTS, stamp, run_dir / "config.json")
    if resume and not trainer.resume():
        raise TaskformerError(f"{run_dir}: no checkpoint to resume from (checkpoints/ is empty); the run stopped "
                              f"before its first one, so start it again: taskformer run {task.name} --out {run_dir}")
    checkpoint_bytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())  # weights, Adam's 2 moments
    try:
        with stop_on_signals(trainer, task.name), ckpt.disk_space(run_dir, checkpoint_bytes):
            state = trainer.fit(time_limit * 60 if time_limit else None)
    except ckpt.DiskFull as e:
        then = (f"resume with: taskformer run --resume {run_dir}" if ckpt.latest_training_state(run_dir / "checkpoints")
                else f"start the run again with --out {run_dir}")
        raise TaskformerError(f"{e}; free some space, then {then}") from None
    if trainer.stop_reason:
        raise Interrupted(run_dir, trainer.stop_reason)
    if shard[0] != 0:
        return run  # rank 0 alone evaluates the best checkpoint and reports
    load_run_weights(model, run_dir, stamp)
    for split in ("val", "test"):
        run.metrics[split], run.outputs[split] = evaluate_split(run, data.splits[split], name=f"decoding {split}")
    bf16, why = precision.choose(config.train.bf16, device)
    run.info = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "device": str(device),
        "precision": f"{'bf16' if bf16 else 'fp32'} ({why})",
        "threads": torch.get_num_threads(),
        "parameters": model.num_parameters(),
        "data": {s: len(data.splits[s]) for s in SPLITS},
        "vocab_size": data.tokenizer.get_vocab_size(),
        "truncated": {"train": train_enc.truncated, "val": val_enc.truncated},
        "notes": data.notes,
        "train_seconds": round(state["elapsed"], 1),
        "wall_seconds": round(time.monotonic() - started, 1),
        "steps": state["step"],
        "epochs": state["epoch"] + (1 if state["batch"] else 0),
        "train_tokens": state["tokens"],
        "tokens_per_s": round(state["tokens"] / max(state["elapsed"], 1e-9)),
        "best_step": state["best_step"],
        "kept_weights": ckpt.weights_name(state["best_weights"] or [state["best_step"]]),
        "stopped": state["stopped"] or "completed all epochs",
    }
    for split, rows in run.outputs.items():
        ckpt.atomic_write(run_dir / f"outputs-{split}.jsonl", "".join(
            json.dumps(row_json(row), ensure_ascii=False) + "\n" for row in rows))
    samples = {split: [row_json(row) for row in rows] for split, rows in run.samples.items()}
    ckpt.write_json(run_dir / "result.json", {"task": task.name, "metric": task.metric, "metrics": run.metrics,
                                               "samples": samples, "info": run.info,
                                               "weights_sha256": ckpt.sha256(run_dir / ckpt.WEIGHTS)})
    return run


def row_json(row: tuple[str, Prediction, str]) -> dict:
    """One output as outputs-*.jsonl stores it; a Label as ``{"label", "probability"}``."""
    source, prediction, reference = row
    output = prediction._asdict() if isinstance(prediction, Label) else prediction
    fields = getattr(row, "fields", None)
    return {"source": source, "output": output, "reference": reference, **({"fields": fields} if fields else {})}


def row_from_json(row: dict, classify: bool) -> tuple[str, Prediction, str]:
    """Back from outputs-*.jsonl (a classifier's prediction as a line: see core/compat.py)."""
    output = row["output"]
    if isinstance(output, dict):
        output = Label(output["label"], output["probability"])
    elif classify:
        output = compat.label_from_line(output)
    return Output(row["source"], output, row["reference"], row.get("fields"))


class Interrupted(TaskformerError):
    """Training was stopped by a signal after a checkpoint was written, or (``saved=False``) in the
    middle of a validation, which is dropped: the last checkpoint, if any, is where a resume starts."""

    def __init__(self, run_dir: Path, why: str, task: str = "", saved: bool = True):
        last = ckpt.latest_training_state(Path(run_dir) / "checkpoints")
        if saved:
            how = f"checkpoint saved. Resume with: taskformer run --resume {run_dir}"
        elif last:
            how = (f"the validation was dropped, the last checkpoint ({last.name}) is kept. Resume with: "
                   f"taskformer run --resume {run_dir}")
        else:
            how = f"no checkpoint was written yet. Start it again with: taskformer run {task} --out {run_dir}"
        super().__init__(f"training {why}; {how}")
        self.run_dir = run_dir
        self.exit_code = 130


def read_run_config(run_dir: Path) -> dict:
    """A run's config.json, checked for the shape taskformer writes before anything is read from it."""
    saved = ckpt.read_json(run_dir / "config.json")
    cfg = saved.get("config") if isinstance(saved, dict) else None
    if not isinstance(cfg, dict) or not isinstance(saved.get("task"), str) or not all(
            isinstance(v, dict) for v in cfg.values()):
        raise TaskformerError(f"{run_dir / 'config.json'}: not a taskformer run config")
    return saved


def precision_record(device: torch.device) -> dict:
    """What ``train.bf16=auto`` found on this hardware when the run started (kept in config.json)."""
    native, why = precision.bf16_native(device.type)
    return {"device": device.type, "bf16_native": native, "why": why}


def pin_precision(saved: dict, run_dir: Path) -> None:
    """A resumed run trains in the precision it started with: a probe on a busy machine may decide
    otherwise, and then the resumed updates would not be the ones the run would have made."""
    record = saved.get("precision")
    if record is None:  # runs from before the record: probe as they did
        return
    if not (isinstance(record, dict) and isinstance(record.get("device"), str)
            and isinstance(record.get("bf16_native"), bool) and isinstance(record.get("why"), str)):
        raise TaskformerError(f"{run_dir / 'config.json'}: damaged 'precision' record (expected device, "
                              "bf16_native and why)")
    precision.pin(record["device"], record["bf16_native"], f"{record['why']}, as when the run started")


def bound_files(run_dir: Path, saved: dict) -> dict[str, str] | None:
    """The stamp the run's weights must carry (its task, run id and tokenizer hash, from config.json),
    after checking that tokenizer.json is the one the run was trained with (``None`` for a run
    without the record: see core/compat.py)."""
    binding = saved.get("binding")
    if binding is None:
        return compat.unbound_run(run_dir)
    if not isinstance(binding, dict) or not all(isinstance(binding.get(k), str) for k in ("run", "tokenizer_sha256")):
        raise TaskformerError(f"{run_dir / 'config.json'}: damaged 'binding' record (expected a run id and the "
                              "tokenizer's SHA-256)")
    marked = ckpt.run_mark(run_dir)
    if marked and marked != binding["run"]:
        raise TaskformerError(f"{run_dir / 'config.json'}: the config of another run (run id {binding['run'][:12]}, "
                              f"but this run directory is run {marked[:12]}); put the run's own config.json back")
    path = run_dir / "tokenizer.json"
    if hashlib.sha256(ckpt.read_bytes(path)).hexdigest() != binding["tokenizer_sha256"]:  # bounded read
        raise TaskformerError(f"{path}: not the tokenizer this run was trained with (its SHA-256 differs from the "
                              "one config.json records); put the run's own tokenizer.json back")
    return {"task": saved["task"], "run": binding["run"], "tokenizer_sha256": binding["tokenizer_sha256"]}


def read_tokenizer(run_dir: Path) -> Tokenizer:
    """A run's tokenizer.json, with the special ids the core relies on."""
    path = run_dir / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_str(ckpt.read_bytes(path).decode("utf-8"))  # bounded, regular files only
    except TaskformerError:
        raise
    except Exception as e:
        raise TaskformerError(f"{run_dir}: unreadable run ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    try:
        check_specials(tokenizer)
    except ValueError as e:
        raise TaskformerError(f"{path}: {e}; this is not the tokenizer the model was trained with") from None
    return tokenizer


def load_run_weights(model: Transformer, run_dir: Path, stamp: dict[str, str] | None) -> None:
    """The run's model.safetensors into ``model``, refused if its stamp is not this run's (checked
    after the weights themselves, so that a damaged file is named as such)."""
    ckpt.load_weights(model, run_dir / ckpt.WEIGHTS)
    if stamp:
        ckpt.check_stamp(run_dir / ckpt.WEIGHTS, stamp, run_dir / "config.json")


def load(run_dir: str | Path) -> Run:
    """Load a finished (or in-progress) run for eval, predict and report."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise TaskformerError(f"{run_dir}: no such run directory")
    ckpt.refuse_pickles(run_dir)
    saved = read_run_config(run_dir)
    cfg = saved["config"]
    task = plugins().task(saved["task"])
    if str(cfg.get("train", {}).get("bf16")).lower() == "true":
        cfg["train"]["bf16"] = "auto"  # a forced bf16 was for training there; decoding here follows this hardware
    if cfg.get("model", {}).get("variant") != task.variant:
        raise TaskformerError(f"{run_dir}: config is for a {cfg.get('model', {}).get('variant')} model, "
                              f"but task {task.name!r} is {task.variant}")
    config = saved_config(task, cfg, str(run_dir / "config.json"))
    use_threads(config)
    stamp = bound_files(run_dir, saved)
    tokenizer = read_tokenizer(run_dir)
    model = build_model(task, config, tokenizer.get_vocab_size(), saved.get("labels")).to(pick_device())
    load_run_weights(model, run_dir, stamp)
    model.eval()
    result = run_dir / "result.json"
    saved_result = ckpt.read_json(result) if result.exists() else {}
    finished_with = saved_result.get("weights_sha256")
    if finished_with and ckpt.sha256(run_dir / ckpt.WEIGHTS) != finished_with:
        raise TaskformerError(f"{run_dir / ckpt.WEIGHTS}: not the weights this run finished with (their SHA-256 "
                              "differs from the one result.json records)")
    run = Run(run_dir, task, config, tokenizer, saved.get("labels"), model)
    run.metrics, run.info = saved_result.get("metrics", {}), saved_result.get("info", {})
    for path in run_dir.glob("outputs-*.jsonl"):
        try:
            run.outputs[path.stem.removeprefix("outputs-")] = [row_from_json(r, task.variant == "encoder-only")
                                                               for r in ckpt.read_jsonl(path)]
        except (LookupError, TypeError, ValueError) as e:
            raise TaskformerError(f"{path}: not a taskformer outputs file ({type(e).__name__}: {e})") from None
    return run
