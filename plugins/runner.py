"""Glue between the hooks and the core: build a task's model, train, evaluate, predict, report.

The trainer in :mod:`taskformer.core.engine` never sees a task; this module asks the task's
plugin for data, head and decoder through the hooks and hands the core plain tensors.
"""
from __future__ import annotations

import copy
import datetime as dt
import json
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer

from ..core import checkpoint as ckpt
from ..core import config as C
from ..core import decoding
from ..core import precision
from ..core import progress
from ..core.data import TaskData, encode, encode_sources, pad
from ..core.engine import Trainer, autocast, evaluate_loss
from ..core.errors import TaskformerError
from ..core.model import Transformer
from ..core.tokenize import check_specials
from .hookspecs import Task
from .manager import PluginError, plugins

SPLITS = ("train", "val", "test")


@dataclass
class Run:
    """Everything known about one run; report sections and commands read from it."""

    dir: Path
    task: Task
    config: dict
    tokenizer: Tokenizer
    labels: list[str] | None
    model: Transformer
    metrics: dict[str, dict] = field(default_factory=dict)  # split -> metric -> value
    samples: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)  # split -> a few (src, hyp, ref)
    outputs: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)  # split -> every (src, hyp, ref)
    info: dict = field(default_factory=dict)  # data sizes, wall time, throughput, notes

    @property
    def history(self) -> list[dict]:
        path = self.dir / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_config(task: Task, config_file: str | None, overrides: list[str], seed: int | None) -> dict:
    cfg = C.base_config(task.defaults, task.variant)
    if config_file:
        C.merge(cfg, C.read_config_file(config_file), str(config_file))
    C.merge(cfg, C.parse_overrides(overrides), "--set")
    if seed is not None:
        cfg["train"]["seed"] = seed
    C.validate(cfg)
    return cfg


def build_model(task: Task, cfg: dict, vocab_size: int, labels: list[str] | None) -> Transformer:
    cfg["model"]["vocab_size"] = vocab_size
    cfg["model"]["num_classes"] = len(labels) if labels else 0
    mc = C.model_config(cfg)
    head = plugins().call("taskformer_head", task, model_config=mc)
    if head is not None and not isinstance(head, torch.nn.Module):
        raise PluginError(f"plugin {task.plugin!r}: taskformer_head must return a torch.nn.Module, got {type(head).__name__}")
    return Transformer(mc, head)


def decode_texts(task: Task, model: Transformer, tokenizer: Tokenizer, labels, cfg: dict, texts: list[str],
                 name: str = "decoding"):
    """Decode raw source lines through the task's decoder, batched by length; blank lines give blank outputs.

    Returns the outputs in input order and how many inputs were truncated to ``model.max_len``.
    """
    model.eval()
    outputs = [""] * len(texts)
    todo = [i for i, t in enumerate(texts) if t.strip()]
    src, cut = encode_sources(tokenizer, [texts[i] for i in todo], model.cfg.max_len,
                              classify=model.cfg.variant == "encoder-only")
    order = sorted(range(len(todo)), key=lambda j: len(src[j]))
    dc, device = C.decode_config(cfg), next(model.parameters()).device
    chunks = [order[start : start + dc.batch_size] for start in range(0, len(order), dc.batch_size)]

    def run(chunk: list[int]) -> list[str]:
        batch = pad([src[j] for j in chunk]).to(device)
        with autocast(cfg["train"]["bf16"], device):
            outs = plugins().call("taskformer_decode", task, model=model, src=batch, tokenizer=tokenizer,
                                  labels=labels, config=cfg)
        if not isinstance(outs, list) or len(outs) != len(chunk) or not all(isinstance(o, str) for o in outs):
            raise PluginError(f"plugin {task.plugin!r}: taskformer_decode must return one string per source row")
        return outs

    workers = decoding.decode_workers(dc.workers, device, len(chunks))
    with progress.stage(name, len(order)) as advance:
        for chunk, outs in zip(chunks, decoding.parallel_map(run, chunks, workers)):
            for j, out in zip(chunk, outs):
                outputs[todo[j]] = out
            advance(len(chunk))
    return outputs, cut


def score(task: Task, pairs: list[tuple[str, str]], hyps: list[str]) -> dict:
    """Merge the metrics every plugin reports for this task."""
    merged: dict = {}
    results = plugins().call("taskformer_metrics", task, sources=[s for s, _ in pairs], hypotheses=hyps,
                             references=[r for _, r in pairs])
    for part in results:
        if not isinstance(part, dict):
            raise PluginError(f"plugin {task.plugin!r}: taskformer_metrics must return a dict, got {type(part).__name__}")
        merged.update(part)
    return merged


def evaluate_split(run: Run, pairs: list[tuple[str, str]], cfg: dict | None = None, name: str = "decoding"):
    """Decode and score one split; returns (metrics, [(source, output, reference), ...])."""
    hyps, _ = decode_texts(run.task, run.model, run.tokenizer, run.labels, cfg or run.config, [s for s, _ in pairs],
                           name)
    return score(run.task, pairs, hyps), [(s, h, r) for (s, r), h in zip(pairs, hyps)]


def spread(items: list, n: int = 5) -> list:
    """``n`` items evenly spaced over the list (report samples that are not all from the start)."""
    return items[:: max(1, len(items) // n)][:n]


def load_data(task: Task, cfg: dict, data_dir: str | None) -> TaskData:
    data = plugins().call("taskformer_data", task, config=cfg, data_dir=Path(data_dir) if data_dir else None)
    if not isinstance(data, TaskData):
        raise PluginError(f"plugin {task.plugin!r}: taskformer_data must return a TaskData, got {type(data).__name__}")
    missing = [s for s in SPLITS if not data.splits.get(s)]
    if missing:
        raise PluginError(f"plugin {task.plugin!r}: taskformer_data returned no {', '.join(missing)} split")
    try:
        check_specials(data.tokenizer)
    except ValueError as e:
        raise PluginError(f"plugin {task.plugin!r}: {e}") from None
    return data


def default_run_dir(task: str) -> Path:
    return Path("runs") / task / dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def new_run_dir(task: str, out: str | None) -> Path:
    path = Path(out) if out else default_run_dir(task)
    if (path / "config.json").exists():
        raise TaskformerError(f"{path} already holds a run; choose another --out or resume it with --resume {path}")
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def stop_on_signals(trainer: Trainer):
    """SIGINT/SIGTERM finish the current step, checkpoint, and end training (instead of losing it)."""
    def handler(signum, frame):
        trainer.stop_reason = f"interrupted by {signal.Signals(signum).name}"
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
    with progress.listening(on_event):
        return _train(task_name, data_dir, out, time_limit, seed, config_file, overrides, resume, on_event, shard)


def _train(task_name, data_dir, out, time_limit, seed, config_file, overrides, resume, on_event, shard) -> Run:
    if resume:
        run_dir = Path(resume)
        saved = ckpt.read_json(run_dir / "config.json")
        task = plugins().task(saved["task"])
        cfg, data_dir, time_limit = saved["config"], saved.get("data_dir"), saved.get("time_limit")
    else:
        task = plugins().task(task_name)
        cfg = make_config(task, config_file, list(overrides), seed)
        run_dir = new_run_dir(task.name, out) if shard[0] == 0 else None
        if shard[1] > 1:  # every rank writes to (or reads) the directory rank 0 chose
            shared = [run_dir]
            torch.distributed.broadcast_object_list(shared, src=0)
            run_dir = shared[0]
    started = time.monotonic()
    with progress.stage("loading data and training the tokenizer"):
        data = load_data(task, cfg, data_dir)
    device = pick_device()
    torch.manual_seed(cfg["train"]["seed"])
    model = build_model(task, cfg, data.tokenizer.get_vocab_size(), data.labels).to(device)
    if not resume and shard[0] == 0:
        data.tokenizer.save(str(run_dir / "tokenizer.json"))
        ckpt.write_json(run_dir / "config.json", {"task": task.name, "labels": data.labels, "config": cfg,
                                                   "data_dir": data_dir, "time_limit": time_limit})
    classify = task.variant == "encoder-only"
    max_len = cfg["model"]["max_len"]
    with progress.stage("encoding the train and val splits"):
        train_enc, val_enc = (encode(data, s, max_len, classify) for s in ("train", "val"))
    run = Run(run_dir, task, cfg, data.tokenizer, data.labels, model)
    eval_cfg = copy.deepcopy(cfg)
    eval_cfg["decode"]["strategy"] = cfg["decode"]["eval_strategy"]
    tcfg = C.train_config(cfg)

    def evaluate() -> dict:
        metrics, _ = evaluate_split(run, data.splits["val"], eval_cfg, "validating")
        return {"loss": evaluate_loss(model, val_enc, tcfg, device), **metrics}

    trainer = Trainer(model, tcfg, train_enc, evaluate, (task.metric, task.higher_is_better), run_dir, device,
                      on_event=on_event, shard=shard)
    if resume and not trainer.resume():
        raise TaskformerError(f"{run_dir}: no checkpoint to resume from (checkpoints/ is empty)")
    with stop_on_signals(trainer):
        state = trainer.fit(time_limit * 60 if time_limit else None)
    if trainer.stop_reason:
        raise Interrupted(run_dir, trainer.stop_reason)
    if shard[0] != 0:
        return run  # rank 0 alone evaluates the best checkpoint and reports
    ckpt.load_weights(model, run_dir / ckpt.WEIGHTS)
    for split in ("val", "test"):
        run.metrics[split], run.outputs[split] = evaluate_split(run, data.splits[split], name=f"decoding {split}")
        run.samples[split] = spread(run.outputs[split])
    bf16, why = precision.choose(cfg["train"]["bf16"], device)
    run.info = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "device": str(device),
        "precision": f"{'bf16' if bf16 else 'fp32'} ({why})",
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
        "stopped": state["stopped"] or "completed all epochs",
    }
    for split, rows in run.outputs.items():
        ckpt.atomic_write(run_dir / f"outputs-{split}.jsonl", "".join(
            json.dumps({"source": s, "output": h, "reference": r}, ensure_ascii=False) + "\n" for s, h, r in rows))
    ckpt.write_json(run_dir / "result.json", {"task": task.name, "metric": task.metric, "metrics": run.metrics,
                                               "samples": run.samples, "info": run.info})
    return run


class Interrupted(TaskformerError):
    """Training was stopped by a signal after a checkpoint was written."""

    def __init__(self, run_dir: Path, why: str):
        super().__init__(f"training {why}; checkpoint saved. Resume with: taskformer run --resume {run_dir}")
        self.run_dir = run_dir
        self.exit_code = 130


def load(run_dir: str | Path) -> Run:
    """Load a finished (or in-progress) run for eval, predict and report."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise TaskformerError(f"{run_dir}: no such run directory")
    ckpt.refuse_pickles(run_dir)
    saved = ckpt.read_json(run_dir / "config.json")
    if not isinstance(saved, dict) or "task" not in saved or "config" not in saved:
        raise TaskformerError(f"{run_dir / 'config.json'}: not a taskformer run config")
    task = plugins().task(saved["task"])
    cfg = saved["config"]
    if str(cfg.get("train", {}).get("bf16")).lower() == "true":
        cfg["train"]["bf16"] = "auto"  # a forced bf16 was for training there; decoding here follows this hardware
    if cfg.get("model", {}).get("variant") != task.variant:
        raise TaskformerError(f"{run_dir}: config is for a {cfg.get('model', {}).get('variant')} model, "
                              f"but task {task.name!r} is {task.variant}")
    try:
        C.validate(cfg)
        tokenizer = Tokenizer.from_file(str(run_dir / "tokenizer.json"))
    except Exception as e:
        raise TaskformerError(f"{run_dir}: unreadable run ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    model = build_model(task, cfg, tokenizer.get_vocab_size(), saved.get("labels")).to(pick_device())
    ckpt.load_weights(model, run_dir / ckpt.WEIGHTS)
    model.eval()
    run = Run(run_dir, task, cfg, tokenizer, saved.get("labels"), model)
    result = run_dir / "result.json"
    if result.exists():
        saved_result = ckpt.read_json(result)
        run.metrics, run.info = saved_result.get("metrics", {}), saved_result.get("info", {})
        run.samples = {k: [tuple(x) for x in v] for k, v in saved_result.get("samples", {}).items()}
    for path in run_dir.glob("outputs-*.jsonl"):
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        run.outputs[path.stem.removeprefix("outputs-")] = [(r["source"], r["output"], r["reference"]) for r in rows]
    return run
