"""A training run, new or resumed: :func:`train` begins it (a new run from
:func:`~taskformer.app.prepare.prepare`, a resumed one from its config.json), fits it under its
signals, and finishes it with the final evaluation and the result files."""
from __future__ import annotations

import datetime as dt
import signal
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from taskformer.app import datacache, trackers
from taskformer.app.decodetime import decode_seconds, final_seconds, length_share, uncached, validation_config
from taskformer.app.hooks import build_model, engine_choice, evaluate_split, load_data
from taskformer.app.outdir import new_run_dir
from taskformer.app.prepare import Prepared, TrainRequest, check_batches, distilled, keep_planned, prepare
from taskformer.app.resources import pick_device, use_threads
from taskformer.app.rundir import (
    CONFIG,
    DISTILLATION,
    ConfigRecord,
    ResultRecord,
    RunDirBusy,
    bound_files,
    config_path,
    finished,
    last_checkpoint,
    load_run_weights,
    locked,
    model_digest,
    read_config,
    read_metrics,
    read_tokenizer,
    row_json,
    run_mark,
    write_config,
    write_outputs,
    write_result,
    write_tokenizer,
)
from taskformer.app.trackers import TrackedLog
from taskformer.core import checkpoint as ckpt
from taskformer.core import config as C
from taskformer.core import cores, inference, precision, progress
from taskformer.core.clock import BUSY_SHARE, Clock
from taskformer.core.config import RunConfig
from taskformer.core.data import Encoded, TaskData
from taskformer.core.engine import Trainer, patience_reason
from taskformer.core.errors import TaskformerError
from taskformer.core.train_config import TrainConfig
from taskformer.plugins.hookspecs import Task
from taskformer.plugins.manager import plugins
from taskformer.plugins.run import SPLITS, Run
from taskformer.plugins.sections import count


def saved_config(task: Task, saved: dict, source: str) -> RunConfig:
    """A run's config.json section; options added since it was written take their defaults. A damaged
    value is named in ``source``, its file, not as a setting the user gave."""
    try:
        return C.build(task, C.merge(C.defaults(task), saved, source, saved=True, kinds=C.section_types(task)))
    except TaskformerError as e:
        raise TaskformerError(f"{source}: {str(e).removeprefix(f'{source}: ').removeprefix('config: ')}") from None


@contextmanager
def stop_on_signals(trainer: Trainer, again: str):
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
            raise Interrupted(trainer.run_dir, f"{trainer.stop_reason} during validation", again, saved=False)
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
            if request.resume:
                begun = resumed(request, shard, lock)
            else:
                prepared = prepare(request, shard)
                if prepared.recipe:
                    on_event({"event": "recipe", **prepared.recipe})
                begun = begin(prepared, request.out, shard, lock, request.claimed)
            on_event({"event": "begun", "run_dir": str(begun.run.dir), "time_limit": begun.time_limit,
                      "since_start": begun.clock.since_start()})
            state = fit(begun, on_event, shard)
            return begun.run if shard[0] != 0 else finish(begun, state)  # rank 0 alone evaluates and reports
        except RunDirBusy as e:
            raise TaskformerError(f"{e}; wait for it to end or choose another --out") from None


@dataclass
class Begun:
    """A run with its directory, model and data, about to fit."""

    run: Run
    data: TaskData
    time_limit: float | None  # minutes, as config.json records them
    clock: Clock  # the time limit, counted from when the command began
    stamp: dict | None  # what the run's weights must carry (see rundir.bound_files)
    recipe: dict | None
    resume: bool
    train: Encoded | None = None  # the encoded train and val splits (see :func:`encoded`)
    val: Encoded | None = None
    distill: dict | None = None  # where the train targets came from (a teacher): config.json's record

    def again(self) -> str:
        """The command that starts this run again where it stopped before its first checkpoint."""
        if self.distill:  # the teacher's outputs stay in the run directory
            return f"taskformer distill --resume {self.run.dir}"
        return f"taskformer run {self.run.task.name} --out {self.run.dir}"

    def encoded(self) -> Begun:
        with progress.stage("encoding the train and val splits"):
            self.train, self.val = (datacache.encoded(self.data, s, self.run.config.model.max_len,
                                                      self.run.task.variant) for s in ("train", "val"))
        return self


def begin(prepared: Prepared, out: str | None, shard: tuple[int, int], lock: ExitStack,
          claimed: Path | None = None) -> Begun:
    """A prepared new run: its directory (created only now, so a run refused by its data or its
    budget leaves none, unless ``claimed`` already: a distillation's, which holds its teacher's
    outputs), its model, and the config.json that records them."""
    task, config, data = prepared.task, prepared.config, prepared.data
    run_dir = (claimed or new_run_dir(task.name, out, lock)) if shard[0] == 0 else None
    if shard[1] > 1:  # every rank writes to (or reads) the directory rank 0 chose
        shared = [run_dir]
        torch.distributed.broadcast_object_list(shared, src=0)
        run_dir = shared[0]
    assert run_dir is not None
    torch.manual_seed(config.train.seed)
    model = build_model(task, config, data.tokenizer.get_vocab_size(), data.labels, training=True).to(prepared.device)
    stamp = None
    if shard[0] == 0:
        with writes_named(run_dir, checkpoint_size(model)):  # the folder may have become read-only since its probe
            binding = {"run": run_mark(run_dir), "tokenizer_sha256": write_tokenizer(run_dir, data.tokenizer)}
            write_config(run_dir, ConfigRecord(task=task.name, labels=data.labels, config=config.to_dict(),
                                               data_dir=prepared.data_dir, time_limit=prepared.time_limit,
                                               binding=binding, recipe=prepared.recipe or None,
                                               distill=prepared.distill or None,
                                               precision=precision_record(prepared.device)))
        stamp = {"task": task.name, **binding, "model_sha256": model_digest(config.to_dict()["model"], data.labels)}
    run = Run(run_dir, task, config, data.tokenizer, data.labels, model, read_history=partial(read_metrics, run_dir))
    return Begun(run, data, prepared.time_limit, prepared.clock, stamp, prepared.recipe, resume=False,
                 distill=prepared.distill).encoded()


def resumed(request: TrainRequest, shard: tuple[int, int], lock: ExitStack) -> Begun:
    """An interrupted run as its config.json, tokenizer and data say, to continue from its last checkpoint."""
    clock = Clock(None)  # the limit is the saved one, counted from now
    assert request.resume is not None
    run_dir = Path(request.resume)
    if not run_dir.is_dir():
        raise TaskformerError(f"{run_dir}: no such run directory")
    if shard[0] == 0:
        lock.enter_context(locked(run_dir))
    if finished(run_dir):
        raise TaskformerError(f"{run_dir} has finished (result.json exists): nothing to resume; "
                              "start a new run to train longer")
    if not config_path(run_dir).exists() and (run_dir / DISTILLATION).is_file():
        raise TaskformerError(f"{run_dir} holds a distillation whose student has not begun (no {CONFIG} yet): "
                              f"continue it with: taskformer distill --resume {run_dir}")
    saved = read_config(run_dir)
    pin_precision(saved)
    task = plugins().task(saved.task)
    config = saved_config(task, saved.config, str(config_path(run_dir)))
    stamp, tokenizer = bound_files(run_dir, saved), read_tokenizer(run_dir)
    use_threads(config)
    with progress.stage("loading data and training the tokenizer"):
        data = datacache.load(task, config, saved.data_dir,
                              lambda: load_data(task, config, saved.data_dir, tokenizer=tokenizer), tokenizer)
    if saved.distill is not None:  # a distillation's student learns its teacher's outputs, resumed too
        data = distilled(data, saved.distill if isinstance(saved.distill, dict) else {}, run_dir)
    check_batches(task, config, data, shard[1])  # the data folder may have changed since
    torch.manual_seed(config.train.seed)
    model = build_model(task, config, data.tokenizer.get_vocab_size(), data.labels, training=True).to(pick_device())
    run = Run(run_dir, task, config, data.tokenizer, data.labels, model, read_history=partial(read_metrics, run_dir))
    clock.limit = saved.time_limit * 60 if saved.time_limit else None
    if isinstance(saved.recipe, dict) and saved.recipe.get("final_seconds"):
        keep_planned(clock, saved.recipe)  # until the checkpoint says what the run kept
    return Begun(run, data, saved.time_limit, clock, stamp, saved.recipe, resume=True,
                 distill=saved.distill).encoded()


def fit(begun: Begun, on_event, shard: tuple[int, int]) -> dict:
    """Train ``begun``'s model under its signals until its budget is spent; returns the trainer's final state.

    Under a time limit the clock keeps back the final evaluation's time as the probe timed it (its own
    search and engine, on outputs of the references' length), scaled as the pace of the updates
    changes. After every validation the last validation is kept at the time that one took, scaled to
    outputs of the references' length (a model early in training writes on to the length limit), and
    after every validation and where the cool-down begins (a short run may see no validation before
    its end) the final evaluation is timed again as the probe timed it, on the model as trained so far, where
    the machine's cores are this run's (a figure timed beside another process would not be one of the
    end's). A validation's own time is not scaled to the final evaluation: our decoder batches the
    split one source length at a time and a runtime any lengths, so their ratio on the probe's groups
    does not hold on the whole split. Validations decode where the probe timed them faster (the
    plan's ``validation_engine``: our decoder, or the final evaluation's runtime converting each
    validation's weights into a temporary folder)."""
    run, data, config = begun.run, begun.data, begun.run.config
    device, task, train_enc, val_enc = run.device, run.task, begun.train, begun.val
    assert train_enc is not None and val_enc is not None  # encoded as it began
    engine = (begun.recipe or {}).get("validation_engine", "torch")  # the faster, as the probe timed it
    eval_config, clock = validation_config(config, engine), begun.clock
    # under a time limit the threads follow a busy machine: without one, a seeded run's numbers stay those of any other
    threads = cores.follower(device, shard[1]) if clock.limit else None

    spent = [-1, 0.0]  # the step validated, and the seconds its validations took (with train.average_last, two)

    def evaluate() -> dict:
        begun_at = clock.now()
        with uncached() if engine != "torch" else nullcontext():  # each validation's weights: not for the cache
            metrics, outputs = evaluate_split(run, data.splits["val"], eval_config, "validating", val_enc)
        if clock.limit:
            took = (clock.now() - begun_at) * length_share(run, outputs, engine)
            spent[:] = [trainer.state.step, took + (spent[1] if spent[0] == trainer.state.step else 0.0)]
            clock.measured("last validation", spent[1])  # the averaged weights' validation follows the weights
            if (clock.for_training() or 0.0) > 0:  # training goes on: the end is still to come
                retime_final(run, data, clock, threads)
        return metrics

    def heard(event: dict) -> None:
        on_event(event)
        if event["event"] == "cooldown" and clock.limit:  # the last stretch: timed on the machine the end will find
            retime_final(run, data, clock, threads)

    trainer = Trainer(run.model, config.train, train_enc, evaluate, (task.metric, task.higher_is_better), run.dir,
                      device, on_event=heard, shard=shard, stamp=begun.stamp, events=TrackedLog(run.dir, task),
                      threads=threads)
    latest = last_checkpoint(run.dir) if begun.resume else None
    if latest and begun.stamp:
        ckpt.check_stamp(latest / ckpt.WEIGHTS, begun.stamp, config_path(run.dir))
    with stop_on_signals(trainer, begun.again()), writes_named(run.dir, checkpoint_size(run.model)):
        if begun.resume and not trainer.resume():  # resuming rewrites metrics.jsonl: a write like the others
            raise TaskformerError(f"{run.dir}: no checkpoint to resume from (checkpoints/ is empty); the run "
                                  f"stopped before its first one, so start it again: {begun.again()}")
        if shard[0] == 0:
            trackers.started(task, run.dir, config, begun.resume, trainer.state.step)
        state = trainer.fit(clock if clock.limit else None)  # a resumed run's clock counts its earlier training too
    if trainer.stop_reason:
        raise Interrupted(run.dir, trainer.stop_reason)
    return state


def retime_final(run: Run, data: TaskData, clock: Clock, threads: cores.Threads | None) -> None:
    """Time the final evaluation again on ``run``'s model as trained so far, as the probe timed it, and keep
    that; not where the run holds back threads for other processes, nor where they took more than a
    busy machine's share of the cores meanwhile: the figure would be a busy machine's, not the end's."""
    if threads is not None and torch.get_num_threads() < threads.most:
        return
    training, before = run.model.training, cores.machine_usage()
    with progress.stage("timing the final evaluation"):
        timing = decode_seconds(run, data, validation=False)
    after = cores.machine_usage()
    run.model.train(training)  # asked in the middle of training too, where the cool-down begins
    if threads is None or before is None or after is None or \
            after.others(before) < (1 - BUSY_SHARE) * threads.cores:
        clock.measured("final evaluation", final_seconds(data, timing)[0])


def stopped_because(cfg: TrainConfig, state: dict) -> str:
    """Why training ended, in words. Where it ended before ``train.max_steps``, the limit that ended it
    and how to lift it: a step budget that the epochs or the patience cut short would otherwise look spent."""
    why = state["stopped"] or "completed all epochs"
    if not cfg.max_steps or state["step"] >= cfg.max_steps:
        return why
    if not state["stopped"]:
        ended, lift = f"train.epochs={cfg.epochs}", "set train.epochs=0 to train by steps"
    elif state["stopped"] == patience_reason(cfg.patience):
        ended, lift = f"train.patience={cfg.patience} (no improvement)", "set train.patience=0 to train to train.max_steps"
    else:  # the time limit or a cool-down the user asked for: the reason says it
        return why
    return f"stopped at {count(state['step'], 'update')}: {ended} ended it before train.max_steps={cfg.max_steps}; {lift}"


def finish(begun: Begun, state: dict) -> Run:
    """Evaluate the best weights on val and test with the run's search; write the outputs and result.json."""
    run, data, config = begun.run, begun.data, begun.run.config
    model, run_dir, task = run.model, run.dir, run.task
    assert begun.train is not None and begun.val is not None  # encoded as it began
    load_run_weights(model, run_dir, begun.stamp)
    decoding = begun.clock.now()
    for split in ("val", "test"):
        if split == "test" and data.splits["test"] == data.splits["val"]:  # a task whose test is its val text
            run.metrics["test"], run.outputs["test"] = run.metrics["val"], run.outputs["val"]  # decoded once
            continue
        run.metrics[split], run.outputs[split] = evaluate_split(run, data.splits[split], name=f"decoding {split}")
    final = begun.clock.now() - decoding
    bf16, why = precision.choose(config.train.bf16, run.device)
    stopped = stopped_because(config.train, state)
    run.info = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "device": str(run.device),
        "precision": f"{'bf16' if bf16 else 'fp32'} ({why})",
        "engine": str(engine_choice(task, model, config)),
        **inference.compile_record(model, config.decode.compile and model.cfg.kind.decoder),
        "threads": torch.get_num_threads(),
        "parameters": model.num_parameters(),
        "data": {s: len(data.splits[s]) for s in SPLITS},
        "vocab_size": data.tokenizer.get_vocab_size(),
        "truncated": {"train": begun.train.truncated, "val": begun.val.truncated},
        "notes": data.notes,
        "train_seconds": round(state["elapsed"], 1),
        "wall_seconds": round(begun.clock.since_start(), 1),
        **({"time_limit_seconds": round(begun.time_limit * 60)} if begun.time_limit else {}),
        "steps": state["step"],
        "epochs": state["epoch"] + (1 if state["batch"] else 0),
        "train_tokens": state["tokens"],
        "tokens_per_s": round(state["tokens"] / max(state["elapsed"], 1e-9)),
        "best_step": state["best_step"],
        "kept_weights": ckpt.weights_name(state["best_weights"] or [state["best_step"]]),
        "stopped": stopped,
        **({"resumed": state["resumed"]} if state["resumed"] else {}),
        "clock": {**begun.clock.account(state["tokens"], state["elapsed"], stopped, final),
                  **({"threads": state["threads"]} if state["threads"] else {})},
        **({"recipe": begun.recipe} if begun.recipe else {}),
        **({"distill": begun.distill} if begun.distill else {}),
    }
    with writes_named(run_dir, checkpoint_size(model)):
        for split, rows in run.outputs.items():
            write_outputs(run_dir, split, rows)
        samples = {split: [row_json(row) for row in rows] for split, rows in run.samples.items()}
        write_result(run_dir, ResultRecord(task=task.name, metric=task.metric, metrics=run.metrics, samples=samples,
                                           info=run.info, weights_sha256=ckpt.sha256(run_dir / ckpt.WEIGHTS)))
    trackers.track(task, run_dir, {"event": "result", "metrics": run.metrics, "info": run.info})
    return run


def checkpoint_size(model: torch.nn.Module) -> int:
    """About the bytes of one checkpoint of ``model``: its weights and Adam's two moments."""
    return 3 * sum(p.numel() * p.element_size() for p in model.parameters())


@contextmanager
def writes_named(run_dir: Path, checkpoint_bytes: int):
    """A failed write to the run directory (full, read-only, removed) as one line with the next step:
    every write is atomic, so the last checkpoint is whole and the run resumes from it."""
    try:
        with ckpt.disk_space(run_dir, checkpoint_bytes):
            yield
    except ckpt.WriteFailed as e:
        then = (f"resume with: taskformer run --resume {run_dir}" if last_checkpoint(run_dir)
                else f"start the run again with --out {run_dir}")
        fix = "free some space" if isinstance(e, ckpt.DiskFull) else "once it can be written"
        raise TaskformerError(f"{e}; {fix}, then {then}") from None


class Interrupted(TaskformerError):
    """Training was stopped by a signal after a checkpoint was written, or (``saved=False``) in the
    middle of a validation, which is dropped: the last checkpoint, if any, is where a resume starts."""

    def __init__(self, run_dir: Path, why: str, again: str = "", saved: bool = True):
        last = last_checkpoint(run_dir)
        if saved:
            how = f"checkpoint saved. Resume with: taskformer run --resume {run_dir}"
        elif last:
            how = (f"the validation was dropped, the last checkpoint ({last.name}) is kept. Resume with: "
                   f"taskformer run --resume {run_dir}")
        else:
            how = f"no checkpoint was written yet. Start it again with: {again}"
        super().__init__(f"training {why}; {how}")
        self.run_dir = run_dir
        self.exit_code = 130


def precision_record(device: torch.device) -> dict:
    """What ``train.bf16=auto`` found on this hardware when the run started (kept in config.json)."""
    precision.unpin()  # a run resumed earlier in this process pinned its own record
    native, why = precision.bf16_native(device.type)
    return {"device": device.type, "bf16_native": native, "why": why}


def pin_precision(saved: ConfigRecord) -> None:
    """A resumed run trains in the precision it started with: a probe on a busy machine may decide
    otherwise, and then the resumed updates would not be the ones the run would have made."""
    if saved.precision is not None:
        record = saved.precision
        precision.pin(record["device"], record["bf16_native"], f"{record['why']}, as when the run started")
