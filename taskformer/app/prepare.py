"""A new run up to its first update, shared by ``taskformer run`` and ``taskformer run --dry-run``.

:func:`prepare` settles everything a new run decides before it trains: its configuration, as
layers (the recipe its budget buys is one of them), the checks that refuse a run at its start
(the budget, memory, ``--out``), its data and, under a time limit, the plan of that time. A dry run
is :func:`prepare` and a description, so it checks what the run checks and plans what it will do.

Under ``--time-limit`` the minutes are the wall time of the whole command, held by the run's
:class:`~taskformer.core.clock.Clock`. Before training, a probe on a throwaway copy of the model
measures the training pace (target tokens/s, the median of its updates') and how long the final
evaluation (val and test, with the run's own search, on the engine that will decode it) and a
validation will take, on whole groups of val sources as the decoder batches them and side by side as
its workers decode them, each output written to its reference's length (a trained model's: an
untrained one writes to the length limit). The clock keeps that back, scaled as the pace of the
updates changes; figures timed while other processes held the cores are kept at what they take with
all of them (:func:`~taskformer.core.clock.busy_share`), so a busy start is not refused on them; the
time left is the training budget, pace x budget picks the task's recipe, and the warm-up is cut to
a share of the updates the budget buys (a 1,000-update warm-up in a 400-update run never reaches its
peak rate). A limit that leaves no time to train is refused with the minimum that would, and a plan
of too few updates to learn is said before training.
"""
from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch

from taskformer.app import datacache, outdir, rundir
from taskformer.app.decodetime import DecodeTiming, decode_seconds, final_seconds
from taskformer.app.hooks import build_model, load_data
from taskformer.app.resources import check_memory, pick_device, use_threads
from taskformer.app.trackers import check_installed
from taskformer.core import budget, progress, variants
from taskformer.core import checkpoint as ckpt
from taskformer.core import config as C
from taskformer.core.clock import FEW_UPDATES, Clock, busy_share, reserve_for
from taskformer.core.config import RunConfig
from taskformer.core.data import Encoded, TaskData, each_row
from taskformer.core.engine import epoch_updates
from taskformer.core.errors import TaskformerError
from taskformer.core.options import unused
from taskformer.plugins.hookspecs import Task
from taskformer.plugins.run import Run
from taskformer.plugins.sections import count


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
    started: float | None = None  # time.monotonic() when the command began (the time limit counts from it); None: now
    nproc: int = 1  # training processes (--nproc): every one of them needs a batch in every epoch
    # A distillation's student (app/distill.py): the run directory it decoded its targets into, already
    # made, marked and locked by this process; the teacher's settings under yours, each (where from,
    # {section: {key: value}}); and the record of its targets (see :func:`distilled`).
    claimed: Path | None = None
    settings: tuple[tuple[str, dict], ...] = ()
    distill: dict | None = None


@dataclass
class Layers:
    """A new run's configuration as layers, later ones winning: the defaults (the core's and the
    task's), what a time limit changes (no epoch cap, a patience: see core.budget), the recipe the
    budget picked, then yours -- the ``--config`` file, ``--set`` and ``--seed`` -- over every choice."""

    task: Task
    time_limit: float | None = None
    yours: list[tuple[str, dict]] = field(default_factory=list)  # (where it was given, {section: {key: value}})

    @classmethod
    def of(cls, task: Task, config_file: str | None, overrides, seed: int | None,
           time_limit: float | None = None, settings: tuple[tuple[str, dict], ...] = ()) -> Layers:
        yours = list(settings)  # given for you: a distillation's teacher's data options, under your own
        yours += [(str(config_file), C.read_config_file(config_file))] if config_file else []
        yours += [("--set", C.parse_overrides(list(overrides)))] if overrides else []
        yours += [("--seed", {"train": {"seed": seed}})] if seed is not None else []
        return cls(task, time_limit, yours)

    def build(self, recipe: dict | None = None, leave_out: Collection[tuple[str, str]] = frozenset()) -> RunConfig:
        """The config with ``recipe``'s layer in its place; ``leave_out``: keys of yours not applied."""
        cfg = C.defaults(self.task)
        if self.time_limit:
            C.merge(cfg, budget.time_limit_layer(cfg["train"]), "--time-limit")
        if recipe:
            C.merge(cfg, recipe, f"task {self.task.name!r} recipe")
        decode = C.section_types(self.task)["decode"]
        for source, layer in self.yours:
            for key in layer["decode"] if isinstance(layer.get("decode"), dict) else ():
                if why := unused(decode, key, self.task.variant):  # set to no effect: say so instead
                    raise TaskformerError(f"{source} decode.{key}: {why}")
            C.merge(cfg, {section: {k: v for k, v in values.items() if (section, k) not in leave_out}
                          if isinstance(values, dict) else values for section, values in layer.items()}, source,
                    kinds=C.section_types(self.task))
        return C.build(self.task, cfg)

    def keys(self) -> set[tuple[str, str]]:
        """Every ``(section, key)`` you set."""
        return {(section, key) for _, layer in self.yours for section, values in layer.items()
                if isinstance(values, dict) for key in values}


def make_config(task: Task, config_file: str | None, overrides: list[str], seed: int | None,
                time_limit: float | None = None) -> RunConfig:
    """A new run's config before any recipe: the task's defaults under your settings."""
    return Layers.of(task, config_file, overrides, seed, time_limit).build()


@dataclass
class Prepared:
    """A new run as :func:`prepare` left it: ready for its first update."""

    task: Task
    config: RunConfig
    data: TaskData
    data_dir: str | None
    device: torch.device
    time_limit: float | None  # minutes of wall time for the whole command, as config.json records them
    clock: Clock  # the time limit, counted from when the command began
    recipe: dict | None = None  # what the budget bought, the record config.json and result.json keep
    distill: dict | None = None  # where the train targets came from (a teacher), the same files' record


MAX_TIME_LIMIT = 525_600  # minutes: a year, which keeps train.pace x the time limit a finite number


def check_time_limit(minutes: float | None) -> None:
    if minutes is not None and not (math.isfinite(minutes) and 0 < minutes <= MAX_TIME_LIMIT):
        raise TaskformerError(f"--time-limit must be a positive, finite number of minutes up to {MAX_TIME_LIMIT:,} "
                              f"(a year), got {minutes}")


def check_budget(config: RunConfig, time_limit: float | None) -> None:
    """Refuse a run that nothing would end: no epoch cap, no step limit and no time limit."""
    if not config.train.epochs and not config.train.max_steps and not time_limit:
        raise TaskformerError("config: train.epochs=0 (no epoch cap) needs a --time-limit or train.max_steps")


def prepare(request: TrainRequest, shard: tuple[int, int] = (0, 1)) -> Prepared:
    """Everything a new run settles before training; writes nothing. See the module's docstring."""
    task, time_limit = request.task, request.time_limit
    assert task is not None, "a new run names its task (a resumed one is not prepared anew)"
    check_time_limit(time_limit)
    clock = Clock.minutes(time_limit, request.started)
    layers = Layers.of(task, request.config_file, request.overrides, request.seed, time_limit, request.settings)
    config = layers.build()
    check_budget(config, time_limit)
    check_installed(config)
    footprint = getattr(config.data, "footprint", None)  # data made from options: can it be made here?
    if footprint:
        check_memory(task, config, **footprint())
    if shard[0] == 0 and request.claimed is None:
        outdir.check_out(request.out, task.name)  # refused now, not after the data and the probe
    use_threads(config)
    with progress.stage("loading data and training the tokenizer"):
        data = datacache.load(task, config, request.data_dir, lambda: load_data(task, config, request.data_dir))
    if request.distill:
        assert request.claimed is not None, "a distillation's student has claimed its run directory"
        data = distilled(data, request.distill, request.claimed)
    world = shard[1] if shard[1] > 1 else request.nproc
    check_batches(task, config, data, world)  # before the probe, which would train on them
    run = Prepared(task, config, data, request.data_dir, pick_device(), time_limit, clock, distill=request.distill)
    if time_limit:
        run.recipe = plan_time(run, layers, shard)
        run.config = layers.build(run.recipe["overrides"])
        check_batches(task, run.config, data, world)  # the recipe may set another max_len or batch size
    return run


def check_batches(task: Task, config: RunConfig, data: TaskData, world: int = 1) -> None:
    """Refuse data that gives a process no update in an epoch, or val or test nothing to score:
    training would count empty epochs forever (or wait for a process that has no batch), and an
    evaluation of nothing has no loss. Only a language model's text or a tagger's words can encode
    to no target; any other row has one."""
    kind = variants.of(task.variant)
    splits = ("train", "val", "test") if not kind.encoder or kind.per_word else ("train",)
    for split in splits:
        if split == "test" and data.splits["test"] == data.splits["val"]:
            continue
        if not datacache.encoded(data, split, config.model.max_len, task.variant).targets():
            why = ("a language model's text needs at least 2 tokens, one to read and the next to predict"
                   if not kind.encoder else f"no word keeps a tag within model.max_len={config.model.max_len}")
            raise TaskformerError(f"task {task.name!r}: the {split} split ({count(len(data.splits[split]), 'row')}) gives "
                                  f"nothing to {'train on' if split == 'train' else 'score'} once encoded ({why}); "
                                  "give more data")
    cfg, lengths = config.train, datacache.encoded(data, "train", config.model.max_len, task.variant).lengths()
    if world > 1 and not epoch_updates(cfg, lengths, 0, world - 1, world):  # the last process gets the fewest
        batches = len(epoch_updates(replace(cfg, accumulate=1), lengths))
        raise TaskformerError(f"the train split gives {count(batches, 'batch', 'batches')} of at most train.max_tokens="
                              f"{cfg.max_tokens:,} tokens an epoch: too few for {world} training processes that "
                              f"each need {cfg.accumulate} (train.accumulate); use --nproc "
                              f"{-(-batches // cfg.accumulate)}, a smaller train.max_tokens or more data")


def distilled(data: TaskData, record: dict, run_dir: Path) -> TaskData:
    """``data`` whose train targets are a teacher's outputs, read from the file ``record`` names in
    the run directory (app/distill.py writes it), or, where ``record["mix"]``, the train split with
    those rows beside it. The file has a row per train row; each source must be the task's own, so
    a student whose data differs from what its teacher read (another folder or data option) is
    refused instead of learning outputs for other sentences."""
    name, mix = record.get("file"), record.get("mix")
    if not (isinstance(name, str) and name == Path(name).name and name not in ("", ".", "..")
            and isinstance(mix, bool)):
        raise TaskformerError(f"{rundir.config_path(run_dir)}: damaged 'distill' record (expected the file of the "
                              "teacher's outputs in the run directory and mix, true or false)")
    path, train = run_dir / name, data.splits["train"]
    rows = ckpt.read_jsonl(path)
    if len(rows) != len(train):
        raise TaskformerError(f"{path}: {len(rows):,} teacher outputs for the {len(train):,} rows of the task's train "
                              "split; the data is not what the teacher decoded (another --data-dir or data option?)")
    taught: list[tuple] = []
    for number, (row, example) in enumerate(zip(rows, each_row(train)), 1):
        source, given = example[0], row.get("source")
        if given != source and not (isinstance(given, list) and tuple(given) == source):  # JSON's pair is a list
            raise TaskformerError(f"{path}:{number}: not the teacher's output for train row {number} of this data "
                                  f"(its source is {str(given)[:60]!r}, the data's {str(source)[:60]!r})")
        output = row.get("output")
        wanted = "a probability for each of the task's labels" if data.labels else "a text"
        if not (is_distribution(output, data.labels) if data.labels else isinstance(output, str)):
            raise TaskformerError(f"{path}:{number}: the teacher's output is not {wanted}; the file is damaged")
        taught.append((source, row["output"], *example[2:]))  # the fields a row may carry
    return replace(data, splits={**data.splits, "train": [*each_row(train), *taught] if mix else taught})


def is_distribution(output, labels: list[str]) -> bool:
    """A classifier teacher's output: a probability for each of ``labels``, summing to one."""
    return (isinstance(output, dict) and sorted(output) == sorted(labels)
            and all(type(p) in (int, float) and 0 <= p <= 1 for p in output.values())
            and abs(sum(output.values()) - 1) < 1e-3)


def plan_time(run: Prepared, layers: Layers, shard: tuple[int, int]) -> dict:
    """The plan of a time-limited run: the recipe its budget buys and the warm-up for the updates
    it plans, as the record a run keeps (see :func:`budget.choose`). The table counts the target
    tokens of the task's own model, so the keys it sets are measured at the task's values, not yours
    (a ``model.members=4`` of yours would measure a quarter of the pace); your other settings stand.
    With several processes rank 0 measures and every rank takes its plan."""
    task = run.task
    record: list[dict[str, Any] | None] = [None]  # rank 0's plan, which every rank takes
    if shard[0] == 0:
        probed = layers.build(leave_out=set(table_keys(task)))
        train_enc = datacache.encoded(run.data, "train", probed.model.max_len, task.variant)
        pace, source, timing, share = probe(run, probed, train_enc, shard[1])
        timer = row_timer(run, layers, probed, shard[1])
        clock = run.clock

        decoded = {probed.model.members: timing}  # by the members: an ensemble's timing, once each

        def timing_of(overrides: dict) -> tuple[DecodeTiming, float]:
            """The row's decode timing, and the share of the cores it was timed with. An ensemble of other
            members than the probe's is timed on a throwaway of its own: the members decode together, with
            the engine it decodes on (one network may run on a runtime that an ensemble cannot), so
            neither is the probe's figure times the members."""
            own = timer(overrides)
            if own is not None:
                return own.timing, own.share
            cfg = layers.build(overrides)
            if cfg.model.members not in decoded:
                with progress.stage(f"timing the decoding of {count(cfg.model.members, 'member')}"):
                    decoded[cfg.model.members] = decode_seconds(throwaway(run, cfg), run.data)
            return decoded[cfg.model.members], share

        def final(overrides: dict) -> tuple[float, float, float]:
            """The row's final evaluation and last validation as timed, and what they are scaled by to be
            an idle machine's (:func:`busy_share`)."""
            timing, had = timing_of(overrides)
            return (*final_seconds(run.data, timing), busy_share(had))

        def idle(overrides: dict) -> float:  # what the row keeps back, as the timings would take with all the cores
            *seconds, had = final(overrides)
            return reserve_for(sum(seconds) * had)

        plan = budget.choose(task.recipes, table_owner(task), pace, lambda o: (clock.left() or 0.0) - idle(o), source,
                             batching(layers, train_enc, probed, pace, timer), clock.left())  # a time limit's: never None
        # the decode was timed at the machine's pace then: the clock scales it as the updates speed up or slow down
        final_then, validation_then, had = final(plan["overrides"])
        clock.keep(final_then, validation_then, 1 / plan["updates_per_second"] if source == "measured" else None, had)
        training = FEW_UPDATES / plan["updates_per_second"] * had  # the least that learns, with all the cores
        if plan["train_seconds"] <= 0:
            raise TaskformerError(f"--time-limit {run.time_limit:g} leaves no time to train: the start took "
                                  f"{clock.elapsed():.0f} s and the final evaluation needs about "
                                  f"{clock.estimates['final evaluation']:.0f} s here; give at least "
                                  f"{clock.minimum(training):g} minutes (for {FEW_UPDATES} updates at "
                                  f"{pace / had:,.0f} tok/s)")
        if had < 1:
            plan["busy"] = (f"the machine was busy while the pace was measured (this process had {had:.0%} of its "
                            f"cores' time): the plan counts a busy machine's pace, and the final evaluation's "
                            f"{final_then:,.0f} s timed here are kept at {final_then * had:,.0f} s, what they take "
                            "with all the cores; both are measured again as the run goes")
        if plan["planned_updates"] < FEW_UPDATES:
            plan["few"] = (f"about {plan['planned_updates']:,} updates are too few to learn the task; at "
                           f"{pace / had:,.0f} tok/s, --time-limit {clock.minimum(training):g} would buy {FEW_UPDATES} "
                           "(a machine that frees up later trains more: the decay follows the time, not this count)")
        chosen, _ = timing_of(plan["overrides"])
        if chosen.validation_engine != "torch":
            val = len(run.data.splits["val"])
            plan["validation_engine"] = chosen.validation_engine
            plan["validating"] = (f"validations decode on {chosen.validation_engine}, its conversion of the weights "
                                  f"included: about {chosen.validation * val:,.1f} s each against "
                                  f"{chosen.validation_torch * val:,.1f} s on our decoder (timed)")
        plan.update(final_seconds=round(clock.estimates["final evaluation"], 1),
                    validation_seconds=round(clock.estimates["last validation"], 1),
                    reserve_seconds=round(clock.reserve(), 1), per_update=clock.timed_at, cpu_share=round(share, 3))
        if overridden := yours_over(task, layers, plan["overrides"]):
            plan["overridden"] = overridden
            plan["why"] += f"; overridden by your settings: {', '.join(overridden)}"
        record[0] = plan
    if shard[1] > 1:
        torch.distributed.broadcast_object_list(record, src=0)
    assert record[0] is not None
    keep_planned(run.clock, record[0])  # every rank's clock, as rank 0 measured
    return record[0]


def keep_planned(clock: Clock, plan: dict) -> None:
    """Keep back what a time-limited run's plan estimated for the end of its training (already as it
    takes with all the cores), and the pace and share of the cores it measured."""
    clock.keep(plan["final_seconds"], plan.get("validation_seconds", 0.0), plan.get("per_update"))
    clock.start_pace, clock.start_share = plan.get("pace"), plan.get("cpu_share")


def probe(run: Prepared, probed: RunConfig, train_enc: Encoded, ranks: int,
          what: str = "the task's network") -> tuple[float, str, DecodeTiming, float]:
    """On a throwaway model of ``probed``, built and trained under a forked random generator (so the
    run's weights and batches are those it would have had without it): the pace (``train.pace`` if
    set, else measured; all ranks together), where it came from, :func:`decode_seconds`, and the
    share of its cores the process had while the pace was measured (1 where it was not)."""
    with progress.stage(f"measuring the training pace and the decoding time of {what}"):
        probe_run = throwaway(run, probed)
        pace, source, share = probed.train.pace, "train.pace", 1.0
        if not pace:
            pace, share = budget.measure_pace(probe_run.model, probed.train, train_enc, run.device)
            pace, source = pace * ranks, "measured"
        timing = decode_seconds(probe_run, run.data)
    return pace, source, timing, share


def throwaway(run: Prepared, config: RunConfig) -> Run:
    """A run of a new model of ``config`` with no directory (nothing of it is written), built under a
    forked random generator: the run's own weights and batches are those it would have had without it."""
    with torch.random.fork_rng(devices=[]):
        model = build_model(run.task, config, run.data.tokenizer.get_vocab_size(), run.data.labels,
                            training=True).to(run.device)
    return Run(None, run.task, config, run.data.tokenizer, run.data.labels, model)  # type: ignore[arg-type]


def yours_over(task: Task, layers: Layers, overrides: dict) -> list[str]:
    """The keys of the task's table and of the row picked whose value your settings changed."""
    keys = [*table_keys(task), *((s, k) for s, values in overrides.items() for k in values)]
    yours, chosen = (layers.build(overrides, leave_out) for leave_out in (set(), layers.keys()))
    return [f"{s}.{k}" for s, k in dict.fromkeys(keys)
            if getattr(getattr(yours, s), k) != getattr(getattr(chosen, s), k)]


class RowTiming(NamedTuple):
    pace: float  # target tokens/s of the row's own network
    timing: DecodeTiming  # of its final evaluation and validations
    train: Encoded  # the train split cut to its positions
    share: float  # of its cores the process had while they were timed


def row_timer(run: Prepared, layers: Layers, probed: RunConfig, ranks: int):
    """``overrides -> RowTiming | None``: a recipe row that changes the network or its batches (a wider
    model, a longer context) has its own pace and final evaluation, timed once on a throwaway model
    of it; ``None`` for a row that does not (the probe's pace holds, scaled by the members: an
    ensemble's decoding is timed apart, see :func:`plan_time`). On a CPU the size of the batches is
    not counted as a change: the tokens per second hardly depend on it (a GPU's grow with it), and
    timing it again would cost the updates of a busy start's slow probe."""
    timed: dict[str, RowTiming | None] = {}  # by the network and batches: each is timed once (a warm-up cut is not)
    batches = ("bf16",) if run.device.type == "cpu" else ("max_tokens", "accumulate", "bf16")

    def of(overrides: dict) -> RowTiming | None:
        cfg = layers.build(overrides)
        key = repr((cfg.model, [getattr(cfg.train, k) for k in batches]))
        if key not in timed:
            if replace(cfg.model, members=probed.model.members) == probed.model and \
                    all(getattr(cfg.train, k) == getattr(probed.train, k) for k in batches):
                timed[key] = None
            else:
                encoded = datacache.encoded(run.data, "train", cfg.model.max_len, run.task.variant)
                pace, _, timing, share = probe(run, cfg, encoded, ranks, f"recipe {budget.describe(overrides)}")
                timed[key] = RowTiming(pace, timing, encoded, share)
        return timed[key]
    return of


def batching(layers: Layers, train_enc: Encoded, probed: RunConfig, pace: float, timer):
    """``overrides -> (updates per target token, warm-up)`` of the config with those overrides: what
    :func:`budget.choose` counts a budget's updates in. The budget is in tokens of the probed model;
    an ensemble of fewer members trains on proportionally more of them, and a row with a network of
    its own (``timer``) trains at its own pace."""
    def of(overrides: dict) -> tuple[float, int]:
        cfg, own = layers.build(overrides), timer(overrides)
        encoded = train_enc if own is None else own.train
        per_token = len(epoch_updates(cfg.train, encoded.lengths())) / max(encoded.targets(), 1)
        if own is None:
            return per_token * probed.model.members / cfg.model.members, cfg.train.warmup
        return per_token * own.pace / pace, cfg.train.warmup
    return of


def table_keys(task: Task) -> list[tuple[str, str]]:
    """Every ``(section, key)`` that some row of the task's recipe table sets, in the table's order."""
    rows = budget.check_table(task.recipes, table_owner(task))
    return list(dict.fromkeys((section, key) for _, overrides, _ in rows
                              for section, values in overrides.items() for key in values))


def table_owner(task: Task) -> str:
    """Who a malformed recipe table's error names: the plugin to fix, and its task."""
    return f"plugin {task.plugin!r}, task {task.name!r}"
