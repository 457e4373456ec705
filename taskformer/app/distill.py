"""``taskformer distill``: sequence-level knowledge distillation (Kim & Rush, 2016).

A finished teacher run -- one network or an ensemble -- translates its task's train sources with its
own search, and a student, a new run of the same task, trains on those translations beside the
references (``distill.mix``, the default) or in their place. The student learns the mode of the
teacher's distribution, which a single network fits more easily than the references' spread of
translations, so one network comes close to the teacher and needs less beam.

The student's run directory holds the teacher's outputs. The train sources are decoded longest
first, in blocks of one decoding batch per worker, and each block is appended to :data:`DECODING`
as it is done: an interrupted decode resumes where it stopped (``taskformer distill --resume
RUN_DIR``), with the outputs the uninterrupted decode gives. When all are decoded they are written
at once, in train order, to :data:`TARGETS` (a row per train row, as ``outputs-*.jsonl`` stores
them), and the student is a normal run of the task: ``prepare.distilled`` puts the outputs in place
of the train split's targets, for the new run and for ``taskformer run --resume`` alike, and
config.json and result.json name the teacher and the file.

A classifier's teacher gives, in place of a translation, its distribution over the labels for each
train source (word-level knowledge distillation; Hinton et al., 2015): an ensemble's averaged
probabilities say which other labels a text resembles, which a one-hot label does not. The student
learns it by cross-entropy against those probabilities (soft targets), with ``distill.mix`` the
one-hot references beside them as for a translation.

Any task whose outputs are searched from an encoder's source, and any classifier, gets this without
code of its own.
"""
from __future__ import annotations

import copy
import itertools
import json
import os
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from taskformer.app import datacache, outdir, rundir, runner, training
from taskformer.app.hooks import decode_texts, load_data
from taskformer.app.prepare import Layers, TrainRequest, check_budget, check_time_limit
from taskformer.app.resources import check_memory
from taskformer.app.rundir import row_json
from taskformer.core import checkpoint as ckpt
from taskformer.core import config as C
from taskformer.core import progress
from taskformer.core.data import TaskData, each_row, encode_sources
from taskformer.core.decoding import decode_workers
from taskformer.core.errors import TaskformerError
from taskformer.core.model import SequenceModel
from taskformer.core.options import check
from taskformer.plugins.hookspecs import Output
from taskformer.plugins.run import Run

REQUEST = rundir.DISTILLATION  # the command as given, which a resume continues
DECODING = "distill-decoding.jsonl"  # the teacher's outputs as they come: {"row": train row, "output": ...}
TARGETS = "distill-train.jsonl"  # all of them in train order: {"source", "output", "reference"[, "fields"]}
# where an output is a text, or a classifier's {label: probability}
FILES = frozenset({REQUEST, DECODING, TARGETS})  # a distillation's own files in its student's run directory


@dataclass
class DistillRequest:
    """What ``taskformer distill`` is asked: a new student of ``teacher``, or the continuation of the
    distillation in ``resume``, whose distill.json then says everything else."""

    teacher: str | None = None  # the teacher's run directory
    data_dir: str | None = None  # default: the teacher's
    out: str | None = None  # the student's run directory; default runs/TASK/<time>
    time_limit: float | None = None  # minutes of the student's run, from the end of the decode
    seed: int | None = None  # default: the teacher's
    overrides: tuple[str, ...] = ()  # --set: distill.KEY=VALUE and the student's own settings
    teacher_set: tuple[str, ...] = ()  # --teacher-set decode.KEY=VALUE: the teacher's search
    resume: str | None = None


def distill(request: DistillRequest, on_event=lambda e: None) -> Run:
    """Decode the teacher's train split into the student's run directory, then train the student
    there; returns the student run with its val and test metrics (see the module's docstring)."""
    if request.resume and rundir.last_checkpoint(Path(request.resume)):
        return training.train(TrainRequest(resume=request.resume), on_event)  # decoded; the student has begun
    with progress.listening(on_event), ExitStack() as lock:
        if request.resume:
            run_dir = Path(request.resume)
            if not run_dir.is_dir():
                raise TaskformerError(f"{run_dir}: no such run directory")
            lock.enter_context(rundir.locked(run_dir))
            asked = read_request(run_dir)
        else:
            assert request.teacher is not None  # a new distillation names its teacher
            asked = {"teacher": str(Path(request.teacher).absolute()), "data_dir": request.data_dir,
                     "time_limit": request.time_limit, "seed": request.seed, "overrides": list(request.overrides),
                     "teacher_set": list(request.teacher_set)}
        chosen, student_sets = settings(asked["overrides"])
        teacher = load_teacher(asked["teacher"], asked["teacher_set"])
        if chosen.temperature != 1 and not teacher.model.cfg.kind.classifies:
            raise TaskformerError(f"distill.temperature softens a classifier teacher's label probabilities; task "
                                  f"{teacher.task.name!r} searches its outputs, so there are none to soften")
        task, data_dir = teacher.task, asked["data_dir"] or rundir.read_config(teacher.dir).data_dir
        inherited = (("the teacher's config.json", {"data": teacher.config.to_dict()["data"],
                                                    "train": {"seed": teacher.config.train.seed}}),)
        student = TrainRequest(task, data_dir, None, asked["time_limit"], asked["seed"], None, tuple(student_sets),
                               settings=inherited)
        options = check_student(student)  # a typo in --set is refused now, not after the decode
        if request.resume:
            check_teacher(teacher, asked, run_dir)
            if not outdir.remove_started(run_dir, FILES):  # a student that stopped before its first checkpoint
                raise TaskformerError(f"{run_dir} holds files that are not this distillation's (nothing in it was "
                                      "changed); start a new distillation with another --out")
        else:
            outdir.check_out(request.out, task.name, FILES)
            asked["teacher_weights_sha256"] = ckpt.sha256(teacher.dir / ckpt.WEIGHTS)
        data = teacher_data(teacher, data_dir, options)
        check_student_data(teacher, data_dir, options, data)
        if not request.resume:  # made only now: a teacher, settings or data refused leave no folder
            run_dir = outdir.new_run_dir(task.name, request.out, lock, FILES)
            ckpt.write_json(run_dir / REQUEST, asked)
        decoded = decode(teacher, data, run_dir, chosen.temperature)
        student.distill = {"teacher": asked["teacher"], "teacher_search": teacher_search(teacher, chosen.temperature),
                           "teacher_members": teacher.model.cfg.members, "mix": chosen.mix, "file": TARGETS,
                           "count": len(data.splits["train"]), **decoded}
        del teacher, data  # the student trains without them in memory
        student.claimed, student.started = run_dir, time.monotonic()  # the time limit is the student's own
        return training.train(student, on_event)


def settings(overrides: list[str]) -> tuple[C.DistillConfig, list[str]]:
    """``--set`` split into the distillation's own options (``distill.KEY=VALUE``, checked) and the
    student's; returns the first and the student's settings."""
    own = [item for item in overrides if item.partition("=")[0].strip().partition(".")[0] == "distill"]
    values = C.merge({"distill": asdict(C.DistillConfig())}, C.parse_overrides(own), "--set")["distill"]
    chosen = C.DistillConfig(**values)
    try:
        check("distill", chosen)
    except ValueError as e:
        raise TaskformerError(f"config: {e}") from None
    return chosen, [item for item in overrides if item not in own]


def check_student(request: TrainRequest) -> C.RunConfig:
    """Refuse, before the decode, what the student's run would refuse at its start: a bad setting or
    time limit, or no budget. Returns the student's configuration."""
    check_time_limit(request.time_limit)
    assert request.task is not None  # the student's task is the teacher's
    config = Layers.of(request.task, None, request.overrides, request.seed, request.time_limit,
                       request.settings).build()
    check_budget(config, request.time_limit)
    return config


def check_student_data(teacher: Run, data_dir: str | None, student: C.RunConfig, data: TaskData) -> None:
    """Refuse, before the decode, what the student's start would refuse after it: a model too large
    for the memory here, and a seed of its own that makes the task's data hook give another train
    split (one that draws its rows or its val from the seed) than the one the teacher decodes."""
    task = teacher.task
    check_memory(task, student, data.tokenizer.get_vocab_size(), len(data.labels or []))
    if student.train.seed == teacher.config.train.seed:
        return
    own = datacache.load(task, student, data_dir, lambda: load_data(task, student, data_dir, tokenizer=data.tokenizer),
                         data.tokenizer)
    if [row[0] for row in each_row(own.splits["train"])] != [row[0] for row in each_row(data.splits["train"])]:
        raise TaskformerError(f"--seed {student.train.seed}: task {task.name!r} draws its data from the seed, so the "
                              f"student's train split would not be the one the teacher decodes (with its seed, "
                              f"{teacher.config.train.seed}); leave --seed out, or train a teacher with that seed")


def load_teacher(path: str, teacher_set: list[str]) -> Run:
    """The finished teacher run (its safetensors weights, checked as ``predict`` checks them) with
    ``--teacher-set`` applied to its search; a tagger or a language model is refused."""
    teacher = runner.load(path)
    kind = teacher.model.cfg.kind
    if kind.per_word:
        raise TaskformerError(f"task {teacher.task.name!r} is a tagger: distilling one (the student learning the "
                              "teacher's tag distribution at every word) is not built; classifiers and tasks with "
                              "a search are")
    if not kind.encoder:
        raise TaskformerError(f"task {teacher.task.name!r} is a language model: its train split is running text, not "
                              "sources for the teacher to translate; distilling it is not built")
    if not teacher.metrics:
        raise TaskformerError(f"{path}: the teacher run has not finished (no result.json); finish it first with "
                              f"taskformer run --resume {path}")
    runner.set_decoding(teacher, teacher_set, "distill --teacher-set")
    return teacher


def check_teacher(teacher: Run, asked: dict, run_dir: Path) -> None:
    """A resumed decode goes on with the teacher it began with, or not at all: other weights would
    give other outputs for the rows still to decode."""
    if ckpt.sha256(teacher.dir / ckpt.WEIGHTS) != asked.get("teacher_weights_sha256"):
        raise TaskformerError(f"{teacher.dir / ckpt.WEIGHTS}: not the weights {run_dir} began decoding with (their "
                              f"SHA-256 differs from the one {REQUEST} records); start a new distillation instead")


def read_request(run_dir: Path) -> dict:
    """A distillation's distill.json, checked for the shape taskformer writes."""
    path = run_dir / REQUEST
    if not path.exists():
        raise TaskformerError(f"{run_dir}: no {REQUEST}, so not a distillation in progress; a run resumes with "
                              f"taskformer run --resume {run_dir}")
    asked = ckpt.read_json(path)
    kinds = {"teacher": str, "data_dir": (str, type(None)), "time_limit": (int, float, type(None)),
             "seed": (int, type(None)), "overrides": list, "teacher_set": list, "teacher_weights_sha256": str}
    wrong = "the top level" if not isinstance(asked, dict) else next(
        (key for key, kind in kinds.items() if not fits(asked.get(key), kind)), None)
    if wrong:
        raise TaskformerError(f"{path}: {wrong} is not what taskformer writes; the file is damaged")
    if rundir.finished(run_dir):
        raise TaskformerError(f"{run_dir} has finished (result.json exists): nothing to resume")
    return asked


def fits(value, kind) -> bool:
    """``value`` is of ``kind`` as JSON gives it: true or false is no number, and a list holds texts."""
    return isinstance(value, kind) and not isinstance(value, bool) and (
        not isinstance(value, list) or all(isinstance(x, str) for x in value))


def teacher_data(teacher: Run, data_dir: str | None, student: C.RunConfig) -> TaskData:
    """The task's data as the student will read it, encoded with the teacher's tokenizer: the data
    options are the teacher's unless the student's ``--set data.KEY=VALUE`` changes them (more
    augmented copies for the teacher to label, say); the seed, which may choose the val rows, stays
    the teacher's, so that no row the teacher trained on becomes the student's val."""
    task, tokenizer = teacher.task, teacher.tokenizer
    config = replace(teacher.config, data=student.data)
    with progress.stage("loading the teacher's data"):
        return datacache.load(task, config, data_dir, lambda: load_data(task, config, data_dir, tokenizer=tokenizer),
                              tokenizer)


def teacher_search(teacher: Run, temperature: float) -> dict:
    """The teacher's search as it ran (its own, changed by ``--teacher-set``); a classifier's outputs are
    its label distributions, softened by ``temperature``."""
    if teacher.model.cfg.kind.classifies:
        return {"strategy": "distribution", "temperature": temperature}
    return runner.search_of(teacher, teacher.config)


def decode(teacher: Run, data: TaskData, run_dir: Path, temperature: float) -> dict:
    """The teacher's outputs for every train source, in :data:`TARGETS` (a classifier's probabilities
    softened by ``temperature``); returns how many rows this command decoded and in how many seconds
    (none where an earlier one finished them).

    Sources go longest first, as :func:`decode_texts` batches them, in blocks of one decoding batch
    per worker; each block is appended to :data:`DECODING` when done, so an interruption loses one
    block at most. A source decodes to the same output whatever its batch (:func:`decode_texts`
    batches sources of one length), so the rows a resume decodes are those the whole decode gives."""
    train, done_path = data.splits["train"], run_dir / DECODING
    if (run_dir / TARGETS).exists():
        done_path.unlink(missing_ok=True)
        return {"decoded_rows": 0, "decode_seconds": 0.0}
    outputs = decoded_so_far(done_path, len(train))
    sources = [row[0] for row in each_row(train)]
    kind = teacher.model.cfg.kind
    ids, _ = encode_sources(teacher.tokenizer, sources, teacher.model.cfg.max_len, classify=kind.classifies)
    order = [i for i in sorted(range(len(train)), key=lambda i: -len(ids[i])) if i not in outputs]
    dc = teacher.config.decode
    block = dc.batch_size * decode_workers(dc.workers, teacher.device, len(train))
    exact = copy.deepcopy(teacher.model).eval().double() if kind.classifies else None  # see distributions()
    begun = time.monotonic()
    with progress.stage("decoding the train split with the teacher", len(train)) as advance:
        advance(len(outputs))
        for start in range(0, len(order), block):
            rows = order[start : start + block]
            try:
                if exact is not None:
                    outs: list = distributions(exact, teacher.labels or [], [ids[i] for i in rows], dc.batch_size,
                                               temperature)
                else:
                    with progress.listening(lambda e: None):  # one bar for the whole split, not one per block
                        texts, _ = decode_texts(teacher.task, teacher.model, teacher.tokenizer, teacher.labels,
                                                teacher.config, [sources[i] for i in rows])
                    outs = [str(out) for out in texts]
            except KeyboardInterrupt:
                stopped = TaskformerError(f"decoding interrupted; {len(outputs):,} of {len(train):,} teacher outputs "
                                          f"are saved. Resume with: taskformer distill --resume {run_dir}")
                stopped.exit_code = 130
                raise stopped from None
            ckpt.append_line(done_path, "\n".join(json.dumps({"row": i, "output": out}, ensure_ascii=False)
                                                  for i, out in zip(rows, outs)))
            outputs.update(zip(rows, outs))
            advance(len(rows))
    ckpt.atomic_write(run_dir / TARGETS, "".join(
        json.dumps(row_json(Output(row[0], outputs[i], row[1], row[2] if len(row) > 2 else None)),
                   ensure_ascii=False) + "\n" for i, row in enumerate(train)))
    done_path.unlink(missing_ok=True)
    return {"decoded_rows": len(order), "decode_seconds": round(time.monotonic() - begun, 1)}


@torch.no_grad()
def distributions(model: SequenceModel, labels: list[str], ids: list[list[int]], size: int,
                  temperature: float) -> list[dict[str, float]]:
    """A classifier's probability of each of ``labels`` for every framed source, softened to
    ``softmax(log p / temperature)`` and rounded to six places, in batches of up to ``size`` sources
    of one length (no padding). ``model`` is a float64 copy (an ensemble still averages its members'
    log-probabilities in fp32, row by row), so the rounded values do not depend on a source's batch:
    in fp32 another batch size moves the last place, and a resumed decode's batches may differ from
    an uninterrupted one's."""
    device = next(model.parameters()).device
    out: list[dict[str, float]] = [{} for _ in ids]
    for _, group in itertools.groupby(sorted(range(len(ids)), key=lambda j: len(ids[j])), lambda j: len(ids[j])):
        same = list(group)
        for start in range(0, len(same), size):
            rows = same[start : start + size]
            logits = model(torch.tensor([ids[j] for j in rows], device=device)).double()  # an ensemble's: mean log p
            probs = torch.softmax(torch.log_softmax(logits, -1) / temperature, -1)
            for j, p in zip(rows, probs.tolist()):
                out[j] = {label: round(x, 6) for label, x in zip(labels, p)}
    return out


def decoded_so_far(path: Path, rows: int) -> dict[int, str | dict[str, float]]:
    """The outputs an interrupted decode appended to ``path``, by train row. A line the interruption
    cut short is dropped from the file, and its rows are decoded again."""
    if not path.exists():
        return {}
    whole = ckpt.read_bytes(path)
    whole = whole[: whole.rfind(b"\n") + 1]
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)  # never through a link
    except OSError as e:
        raise TaskformerError(f"{path}: cannot open the teacher's outputs ({e.strerror})") from None
    try:
        os.ftruncate(fd, len(whole))
    finally:
        os.close(fd)
    outputs = {}
    for number, row in enumerate(ckpt.read_jsonl(path), 1):
        i, out = row.get("row"), row.get("output")
        if not (type(i) is int and 0 <= i < rows and isinstance(out, (str, dict))):
            raise TaskformerError(f"{path}:{number}: not a teacher output of this train split ({rows:,} rows); the "
                                  "file is damaged")
        outputs[i] = out
    return outputs
