"""A training run, new or resumed, from a :class:`TrainRequest`: the configuration, the run
directory, the trainer and its signals, and the final evaluation and result files."""
from __future__ import annotations

import datetime as dt
import json
import signal
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from taskformer.core import budget
from taskformer.core import checkpoint as ckpt
from taskformer.core import compat
from taskformer.core import config as C
from taskformer.core import precision
from taskformer.core import progress
from taskformer.core.config import RunConfig
from taskformer.core.data import encode
from taskformer.core.engine import Trainer, evaluate_loss
from taskformer.core.errors import TaskformerError
from taskformer.plugins.hookspecs import Task
from taskformer.plugins.manager import plugins
from taskformer.app.hooks import build_model, evaluate_split, load_data
from taskformer.app.resources import check_memory, pick_device, use_threads
from taskformer.app.run import SPLITS, Run
from taskformer.app.rundir import (RunDirBusy, bound_files, locked, load_run_weights, model_digest, new_run_dir,
                                   read_run_config, read_tokenizer, row_json, run_mark)


@dataclass
class TrainRequest:
    """What a training run is asked to do: a new run of ``task``, or the continuation of the run in
    ``resume``, whose config.json then says everything else."""

    task: Task | None = None
    data_dir: str | None = None
    out: str | None = None  # the run directory; default runs/TASK/<time>
    time_limit: float | None = None  # minutes
    seed: int | None = None
    config_file: str | None = None
    overrides: tuple[str, ...] = ()  # --set SECTION.KEY=VALUE
    resume: str | None = None


def make_config(task: Task, config_file: str | None, overrides: list[str], seed: int | None,
                time_limit: float | None = None, recipe: dict | None = None) -> RunConfig:
    """The run's config. Layers, later ones winning: the defaults (the core's and the task's), what a
    time limit changes (no epoch cap, a patience: see core.budget), the recipe the budget picked, the
    ``--config`` file, ``--set`` and ``--seed``: what the user sets overrides every choice."""
    cfg = C.defaults(task)
    if time_limit:
        C.merge(cfg, budget.time_limit_layer(cfg["train"]), "--time-limit")
    if recipe:
        C.merge(cfg, recipe, f"task {task.name!r} recipe")
    if config_file:
        C.merge(cfg, C.read_config_file(config_file), str(config_file))
    C.merge(cfg, C.parse_overrides(overrides), "--set")
    if seed is not None:
        C.merge(cfg, {"train": {"seed": seed}}, "--seed")
    return C.build(task, cfg)


def check_budget(config: RunConfig, time_limit: float | None) -> None:
    """Refuse a run that nothing would end: no epoch cap, no step limit and no time limit."""
    if not config.train.epochs and not config.train.max_steps and not time_limit:
        raise TaskformerError("config: train.epochs=0 (no epoch cap) needs a --time-limit or train.max_steps")


def pick_recipe(task: Task, config: RunConfig, data, time_limit: float, device: torch.device,
                shard: tuple[int, int] = (0, 1)) -> dict:
    """The row of ``task.recipes`` that this machine's pace over ``time_limit`` minutes buys (the
    record kept in config.json and result.json). The pace is ``train.pace`` if set, else measured on
    a throwaway model of ``config`` under a forked random generator, so the run's weights and batches
    are those it would have had without it. The table counts the target tokens of the task's own
    model, so the keys it sets are measured at the task's values, not yours (a ``model.members=4``
    of yours would measure a quarter of the pace); your other settings stand. With several
    processes rank 0 measures and every rank takes its choice."""
    if not task.recipes:
        return {"name": "the task's defaults", "overrides": {},
                "why": f"the task's defaults (task {task.name!r} declares no recipes by budget)"}
    record = [None]
    if shard[0] == 0:
        pace, source = config.train.pace, "train.pace"
        if not pace:
            probed = with_table_keys(config, table_keys(task), make_config(task, None, [], None, time_limit))
            with progress.stage("measuring the training pace for the recipe"):
                with torch.random.fork_rng(devices=[]):
                    model = build_model(task, probed, data.tokenizer.get_vocab_size(), data.labels,
                                        training=True).to(device)
                train_enc = encode(data, "train", probed.model.max_len, task.variant)
                pace, source = budget.measure_pace(model, probed.train, train_enc, device) * shard[1], "measured"
        record[0] = budget.choose(task.recipes, table_owner(task), pace, time_limit, source)
    if shard[1] > 1:
        torch.distributed.broadcast_object_list(record, src=0)
    return record[0]


def with_recipe(task: Task, config_file: str | None, overrides, seed: int | None, time_limit: float,
                record: dict) -> RunConfig:
    """:func:`make_config` with the recipe's overrides under the user's settings; ``record`` learns
    which of its choices the user's settings overrode."""
    config = make_config(task, config_file, list(overrides), seed, time_limit, record["overrides"])
    chosen = make_config(task, None, [], None, time_limit, record["overrides"])  # the recipe without your settings
    record["overridden"] = [f"{section}.{key}" for section, key in table_keys(task)
                            if getattr(getattr(config, section), key) != getattr(getattr(chosen, section), key)]
    if record["overridden"]:
        record["why"] += f"; overridden by your settings: {', '.join(record['overridden'])}"
    return config


def table_keys(task: Task) -> list[tuple[str, str]]:
    """Every ``(section, key)`` that some row of the task's recipe table sets, in the table's order."""
    rows = budget.check_table(task.recipes, table_owner(task))
    return list(dict.fromkeys((section, key) for _, overrides, _ in rows
                              for section, values in overrides.items() for key in values))


def table_owner(task: Task) -> str:
    """Who a malformed recipe table's error names: the plugin to fix, and its task."""
    return f"plugin {task.plugin!r}, task {task.name!r}"


def with_table_keys(config: RunConfig, keys: list[tuple[str, str]], source: RunConfig) -> RunConfig:
    """``config`` with the values of ``keys`` taken from ``source``."""
    for section in dict.fromkeys(section for section, _ in keys):
        values = {key: getattr(getattr(source, section), key) for s, key in keys if s == section}
        config = replace(config, **{section: replace(getattr(config, section), **values)})
    return config


def saved_config(task: Task, saved: dict, source: str) -> RunConfig:
    """A run's config.json section; options added since it was written take their defaults. A damaged
    value is named in ``source``, its file, not as a setting the user gave."""
    try:
        return C.build(task, C.merge(C.defaults(task), saved, source))
    except TaskformerError as e:
        raise TaskformerError(f"{source}: {str(e).removeprefix(f'{source}: ').removeprefix('config: ')}") from None


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


def train(request: TrainRequest, on_event=lambda e: None, shard: tuple[int, int] = (0, 1)) -> Run:
    """Train a task end to end (or continue ``request.resume``); returns the run with val/test metrics filled in.

    ``on_event`` receives the training events and the progress of every other stage (see core.progress).
    """
    with progress.listening(on_event), ExitStack() as lock:  # the run directory stays locked until we return
        try:
            return _train(request, on_event, shard, lock)
        except RunDirBusy as e:
            raise TaskformerError(f"{e}; wait for it to end or choose another --out") from None


def _train(request: TrainRequest, on_event, shard: tuple[int, int], lock: ExitStack) -> Run:
    resume = request.resume
    if resume:
        run_dir = Path(resume)
        if not run_dir.is_dir():
            raise TaskformerError(f"{run_dir}: no such run directory")
        if shard[0] == 0:
            lock.enter_context(locked(run_dir))
        if (run_dir / "result.json").exists():
            raise TaskformerError(f"{run_dir} has finished (result.json exists): nothing to resume; "
                                  "start a new run to train longer")
        saved = read_run_config(run_dir)
        pin_precision(saved, run_dir)
        task = plugins().task(saved["task"])
        config = saved_config(task, saved["config"], str(run_dir / "config.json"))
        data_dir, time_limit, recipe = saved.get("data_dir"), saved.get("time_limit"), saved.get("recipe")
        stamp, tokenizer = bound_files(run_dir, saved), read_tokenizer(run_dir)
    else:
        task, data_dir, time_limit = request.task, request.data_dir, request.time_limit
        config = make_config(task, request.config_file, list(request.overrides), request.seed, time_limit)
        check_budget(config, time_limit)
        stamp, tokenizer, recipe = None, None, None
        footprint = getattr(config.data, "footprint", None)  # data made from options: can it be made here?
        if footprint:
            check_memory(task, config, **footprint())
        run_dir = new_run_dir(task.name, request.out, lock) if shard[0] == 0 else None
        if shard[1] > 1:  # every rank writes to (or reads) the directory rank 0 chose
            shared = [run_dir]
            torch.distributed.broadcast_object_list(shared, src=0)
            run_dir = shared[0]
    started = time.monotonic()
    use_threads(config)
    with progress.stage("loading data and training the tokenizer"):
        data = load_data(task, config, data_dir, tokenizer=tokenizer)
    device = pick_device()
    if time_limit and not resume:
        recipe = pick_recipe(task, config, data, time_limit, device, shard)
        config = with_recipe(task, request.config_file, request.overrides, request.seed, time_limit, recipe)
        on_event({"event": "recipe", **recipe})
    torch.manual_seed(config.train.seed)
    model = build_model(task, config, data.tokenizer.get_vocab_size(), data.labels, training=True).to(device)
    if not resume and shard[0] == 0:
        ckpt.atomic_write(run_dir / "tokenizer.json", data.tokenizer.to_str(pretty=True))
        binding = {"run": run_mark(run_dir), "tokenizer_sha256": ckpt.sha256(run_dir / "tokenizer.json")}
        stamp = {"task": task.name, **binding, "model_sha256": model_digest(config.to_dict()["model"], data.labels)}
        ckpt.write_json(run_dir / "config.json", {"task": task.name, "labels": data.labels,
                                                   "config": config.to_dict(), "data_dir": data_dir,
                                                   "time_limit": time_limit, "binding": binding,
                                                   **({"recipe": recipe} if recipe else {}),
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
    checkpoint_bytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())  # weights, Adam's 2 moments
    try:
        with stop_on_signals(trainer, task.name), ckpt.disk_space(run_dir, checkpoint_bytes):
            if resume and not trainer.resume():  # resuming rewrites metrics.jsonl: a write like the others
                raise TaskformerError(f"{run_dir}: no checkpoint to resume from (checkpoints/ is empty); the run "
                                      f"stopped before its first one, so start it again: taskformer run {task.name} "
                                      f"--out {run_dir}")
            state = trainer.fit(time_limit * 60 if time_limit else None)
    except ckpt.WriteFailed as e:
        then = (f"resume with: taskformer run --resume {run_dir}" if ckpt.latest_training_state(run_dir / "checkpoints")
                else f"start the run again with --out {run_dir}")
        fix = "free some space" if isinstance(e, ckpt.DiskFull) else "once it can be written"
        raise TaskformerError(f"{e}; {fix}, then {then}") from None
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
        **({"recipe": recipe} if recipe else {}),
    }
    for split, rows in run.outputs.items():
        ckpt.atomic_write(run_dir / f"outputs-{split}.jsonl", "".join(
            json.dumps(row_json(row), ensure_ascii=False) + "\n" for row in rows))
    samples = {split: [row_json(row) for row in rows] for split, rows in run.samples.items()}
    ckpt.write_json(run_dir / "result.json", {"task": task.name, "metric": task.metric, "metrics": run.metrics,
                                               "samples": samples, "info": run.info,
                                               "weights_sha256": ckpt.sha256(run_dir / ckpt.WEIGHTS)})
    return run


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


def precision_record(device: torch.device) -> dict:
    """What ``train.bf16=auto`` found on this hardware when the run started (kept in config.json)."""
    native, why = precision.bf16_native(device.type)
    return {"device": device.type, "bf16_native": native, "why": why}


def pin_precision(saved: dict, run_dir: Path) -> None:
    """A resumed run trains in the precision it started with: a probe on a busy machine may decide
    otherwise, and then the resumed updates would not be the ones the run would have made."""
    if compat.unrecorded_precision(saved):
        return
    record = saved["precision"]
    if not (isinstance(record, dict) and isinstance(record.get("device"), str)
            and isinstance(record.get("bf16_native"), bool) and isinstance(record.get("why"), str)):
        raise TaskformerError(f"{run_dir / 'config.json'}: damaged 'precision' record (expected device, "
                              "bf16_native and why)")
    precision.pin(record["device"], record["bf16_native"], f"{record['why']}, as when the run started")
