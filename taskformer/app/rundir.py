"""The run directory: the one module that knows its paths and records.

Its lock and marker; the records that say what the run is and what it scored (config.json, result.json:
:class:`ConfigRecord`, :class:`ResultRecord`, written and checked here); tokenizer.json, the logged events (metrics.jsonl), the
outputs (outputs-SPLIT.jsonl); where the checkpoints are; and :func:`find_runs`. The rest of taskformer asks it for them.
A new run's folder (what ``--out`` accepts, its creation) is :mod:`taskformer.app.outdir`'s.

The checkpoints folder's own layout (``step-N/``, ``evaluated/``), its listing and its pruning by
exact name, and the weights, are :mod:`taskformer.core.checkpoint`'s: the training engine writes them
and the core cannot import the application. Older formats that still load are
:mod:`taskformer.core.compat`'s. Errors state the facts; what to type next is said by the command
that hit them.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import stat
import uuid
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from tokenizers import Tokenizer

from taskformer.core import checkpoint as ckpt
from taskformer.core import compat
from taskformer.core.decoding import Label
from taskformer.core.errors import TaskformerError
from taskformer.core.model import Ensemble, Transformer
from taskformer.core.tokenize import check_specials
from taskformer.plugins.hookspecs import Output
from taskformer.plugins.run import Prediction

CONFIG = "config.json"  # what the run is: ConfigRecord, written before the first update
DISTILLATION = "distill.json"  # a distillation's command (taskformer/app/distill.py), written before its teacher decodes
RESULT = "result.json"  # what it scored: ResultRecord, written last, so a finished run has it
TOKENIZER = "tokenizer.json"
METRICS = "metrics.jsonl"  # one JSON object per logged event, appended as training goes
OUTPUTS = "outputs-{split}.jsonl"  # the final outputs of val and test, a row per line


def config_path(run_dir: Path) -> Path:
    """Where the run's config.json is: errors about the run's settings name it."""
    return Path(run_dir) / CONFIG


def metrics_path(run_dir: Path) -> Path:
    """Where the run's log is: errors about its events name it."""
    return Path(run_dir) / METRICS


class RunDirBusy(TaskformerError):
    """Another process holds the run directory's lock (see :func:`locked`)."""


@contextmanager
def locked(run_dir: Path):
    """Hold an exclusive lock on a run directory (flock on the directory itself) while writing it: a
    second writer (another run with the same ``--out``, a ``--resume`` of a run in progress) is
    refused instead of interleaving its files. The kernel drops the lock when the process ends,
    however it ends, so it never goes stale, and no lock file is left behind."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise TaskformerError(f"{run_dir}: cannot open the run directory ({e.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirBusy(f"{run_dir} is being written by another taskformer process") from None
    try:
        yield
    finally:
        os.close(fd)


MARKER = ".taskformer-run"  # in a run directory: {"taskformer_run": RUN_ID}, the first file a run writes


def mark_run(run_dir: Path) -> str:
    """Claim a new, empty run directory: write the marker with a fresh run id (the one config.json's
    binding records) before any other file. Only a folder holding it is ever cleared by taskformer."""
    run_id = uuid.uuid4().hex
    ckpt.write_json(Path(run_dir) / MARKER, {"taskformer_run": run_id})
    return run_id


def run_mark(run_dir: Path) -> str | None:
    """The run id in ``run_dir``'s marker, or None where there is no marker taskformer wrote (a
    link, a non-regular file or anything but our one-key JSON is not ours)."""
    path = Path(run_dir) / MARKER
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        mark = json.loads(ckpt.read_bytes(path, limit=4096))
    except (OSError, TaskformerError, ValueError):
        return None
    run_id = mark.get("taskformer_run") if isinstance(mark, dict) and len(mark) == 1 else None
    return run_id if isinstance(run_id, str) and len(run_id) == 32 and set(run_id) <= set("0123456789abcdef") else None


def is_locked(run_dir: Path) -> bool:
    """Whether a process holds ``run_dir``'s lock (see :func:`locked`): the run is in progress."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released by the close below
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def row_json(row: tuple[str, Prediction, str]) -> dict:
    """One output as outputs-*.jsonl stores it; a Label as ``{"label", "probability"}``."""
    source, prediction, reference = row
    output = prediction._asdict() if isinstance(prediction, Label) else prediction
    fields = getattr(row, "fields", None)
    return {"source": source, "output": output, "reference": reference, **({"fields": fields} if fields else {})}


def row_from_json(row: dict, classify: bool) -> tuple[str, Prediction, str]:
    """Back from outputs-*.jsonl (a classifier's prediction as a line: see core/compat.py); a pair task's
    source, stored as a list of its two texts, as the tuple the data hook gave."""
    output, source = row["output"], row["source"]
    if isinstance(source, list) and len(source) == 2 and all(isinstance(text, str) for text in source):
        source = tuple(source)
    if isinstance(output, dict):
        output = Label(output["label"], output["probability"])
    elif classify and isinstance(output, str):
        output = compat.label_from_line(output)
    wrong = next((key for key, ok in [  # what taskformer writes, so that no report section gets anything else
        ("source", isinstance(source, (str, tuple))), ("reference", isinstance(row["reference"], str)),
        ("output", isinstance(output, Label) and isinstance(output.label, str) and _number(output.probability)
         or isinstance(output, str) and not classify),
        ("fields", isinstance(row.get("fields", {}), dict))] if not ok), None)
    if wrong:
        raise ValueError(f"its {wrong!r} is {json.dumps(row[wrong])[:60]}")
    return Output(source, output, row["reference"], row.get("fields"))


@dataclass(kw_only=True)
class ConfigRecord:
    """config.json: what the run is, written before its first update; a resume and every command
    that loads the run read it back. A record a run of an earlier format lacks is None (core/compat.py)."""

    task: str
    labels: list[str] | None
    config: dict  # the RunConfig, section -> option -> value
    data_dir: str | None = None
    time_limit: float | None = None  # minutes
    binding: dict | None = None  # {"run": run id, "tokenizer_sha256"}: which files belong together
    recipe: dict | None = None  # the recipe row a time limit chose
    distill: dict | None = None  # where a student's train targets came from
    precision: dict | None = None  # what train.bf16=auto found when the run started

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None or k not in ("recipe", "distill")}


def write_config(run_dir: Path, record: ConfigRecord) -> None:
    ckpt.write_json(config_path(run_dir), record.to_json())


def read_config(run_dir: Path) -> ConfigRecord:
    """A run's config.json, checked for the shape taskformer writes before anything is read from it."""
    path = config_path(run_dir)
    saved = ckpt.read_json(path)
    cfg = saved.get("config") if isinstance(saved, dict) else None
    if not isinstance(cfg, dict) or not isinstance(saved.get("task"), str) or not all(
            isinstance(v, dict) for v in cfg.values()):
        raise TaskformerError(f"{path}: not a taskformer run config")
    labels, data_dir, time_limit = saved.get("labels"), saved.get("data_dir"), saved.get("time_limit")
    wrong = next((key for key, ok in [
        ("labels", labels is None or isinstance(labels, list) and all(isinstance(x, str) for x in labels)),
        ("data_dir", data_dir is None or isinstance(data_dir, str)),
        ("time_limit", time_limit is None or _number(time_limit))] if not ok), None)
    if wrong:
        raise TaskformerError(f"{path}: {wrong!r} is not what taskformer writes; the file is damaged")
    binding = saved.get("binding")
    if binding is not None and not (isinstance(binding, dict) and all(
            isinstance(binding.get(k), str) for k in ("run", "tokenizer_sha256"))):
        raise TaskformerError(f"{path}: damaged 'binding' record (expected a run id and the tokenizer's SHA-256)")
    record = saved.get("precision")
    if not compat.unrecorded_precision(saved) and not (
            isinstance(record, dict) and isinstance(record.get("device"), str)
            and isinstance(record.get("bf16_native"), bool) and isinstance(record.get("why"), str)):
        raise TaskformerError(f"{path}: damaged 'precision' record (expected device, bf16_native and why)")
    return ConfigRecord(task=saved["task"], labels=labels, config=cfg, data_dir=data_dir, time_limit=time_limit,
                        binding=binding, recipe=saved.get("recipe"), distill=saved.get("distill"), precision=record)


def _number(value) -> bool:
    return type(value) in (int, float) and value == value and abs(value) != float("inf")


@dataclass(kw_only=True)
class ResultRecord:
    """result.json: what a finished run scored, written last (a run without it has not finished)."""

    task: str
    metric: str  # the task's main metric
    metrics: dict[str, dict]  # split -> metric -> value
    samples: dict[str, list[dict]]  # split -> a few outputs, as outputs-SPLIT.jsonl stores them
    info: dict  # data sizes, wall time, throughput, notes: what the report's run section shows
    weights_sha256: str | None = None  # the weights it finished with

    @classmethod
    def parse(cls, saved) -> ResultRecord:
        """``saved`` (result.json's JSON) as a record; ValueError names the first key that is not what
        taskformer writes: report sections read these keys, and a damaged file must be named as such,
        not blamed on the section."""
        if not isinstance(saved, dict):
            raise ValueError("the top level is not what taskformer writes")
        info, metrics = saved.get("info", {}), saved.get("metrics")
        shape = info if isinstance(info, dict) else {}
        checks = [("task", isinstance(saved.get("task"), str)), ("metric", isinstance(saved.get("metric"), str)),
                  ("weights_sha256", isinstance(saved.get("weights_sha256", ""), str)),
                  ("metrics", isinstance(metrics, dict) and all(isinstance(v, dict) for v in metrics.values())),
                  ("info", isinstance(info, dict)),
                  *((f"info.{k}", isinstance(shape.get(k, {}), dict)) for k in ("data", "truncated", "notes")),
                  ("info.recipe", shape.get("recipe") is None or isinstance(shape["recipe"], dict)),
                  ("info.distill", shape.get("distill") is None or isinstance(shape["distill"], dict)),
                  *((f"info.{k}", k not in shape or _number(shape[k]))
                    for k in ("train_seconds", "wall_seconds", "tokens_per_s")),
                  ("info.date", isinstance(shape.get("date", ""), str))]
        if wrong := next((key for key, ok in checks if not ok), None):
            raise ValueError(f"{wrong} is not what taskformer writes")
        return cls(task=saved["task"], metric=saved["metric"], metrics=saved["metrics"], samples=saved.get("samples", {}),
                   info=info, weights_sha256=saved.get("weights_sha256"))


def write_result(run_dir: Path, record: ResultRecord) -> None:
    ckpt.write_json(Path(run_dir) / RESULT, asdict(record))


def finished(run_dir: Path) -> bool:
    """Whether the run has finished: its result.json is written last."""
    return (Path(run_dir) / RESULT).exists()


def read_result(run_dir: Path) -> ResultRecord | None:
    """A finished run's result.json (None before the run has finished), checked for the shape taskformer writes."""
    path = Path(run_dir) / RESULT
    if not path.exists():
        return None
    try:
        return ResultRecord.parse(ckpt.read_json(path))
    except ValueError as e:
        raise TaskformerError(f"{path}: {e}; the file is damaged") from None


def bound_files(run_dir: Path, saved: ConfigRecord) -> dict[str, str] | None:
    """The stamp the run's weights must carry (its task, run id, tokenizer hash and architecture, from config.json),
    after checking that tokenizer.json is the one the run was trained with (``None`` for a run
    without the record: see core/compat.py)."""
    binding = saved.binding
    if binding is None:
        return compat.unbound_run(run_dir)
    marked = run_mark(run_dir)
    if marked and marked != binding["run"]:
        raise TaskformerError(f"{config_path(run_dir)}: the config of another run (run id {binding['run'][:12]}, "
                              f"but this run directory is run {marked[:12]}); put the run's own config.json back")
    path = run_dir / TOKENIZER
    if hashlib.sha256(ckpt.read_bytes(path)).hexdigest() != binding["tokenizer_sha256"]:  # bounded read
        raise TaskformerError(f"{path}: not the tokenizer this run was trained with (its SHA-256 differs from the "
                              "one config.json records); put the run's own tokenizer.json back")
    return {"task": saved.task, "run": binding["run"], "tokenizer_sha256": binding["tokenizer_sha256"],
            "model_sha256": model_digest(saved.config.get("model"), saved.labels)}


def model_digest(model_section, labels) -> str:
    """The SHA-256 of a run's architecture and labels as config.json records them. The weights carry it
    in their stamp: an edited ``model.n_heads``, pooling or label list would load into weights of the
    same shapes and silently change every prediction."""
    text = json.dumps({"model": model_section, "labels": labels}, sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def write_tokenizer(run_dir: Path, tokenizer: Tokenizer) -> str:
    """Save the run's tokenizer; returns its SHA-256, which config.json's binding records."""
    ckpt.atomic_write(run_dir / TOKENIZER, tokenizer.to_str(pretty=True))
    return ckpt.sha256(run_dir / TOKENIZER)


def read_tokenizer(run_dir: Path) -> Tokenizer:
    """A run's tokenizer.json, with the special ids the core relies on."""
    path = run_dir / TOKENIZER
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


def load_run_weights(model: Transformer | Ensemble, run_dir: Path, stamp: dict[str, str] | None) -> None:
    """The run's model.safetensors into ``model``, refused if its stamp is not this run's (checked
    after the weights themselves, so that a damaged file is named as such)."""
    ckpt.load_weights(model, run_dir / ckpt.WEIGHTS)
    if stamp:
        ckpt.check_stamp(run_dir / ckpt.WEIGHTS, stamp, config_path(run_dir))


def write_outputs(run_dir: Path, split: str, rows: list[tuple[str, Prediction, str]]) -> None:
    ckpt.atomic_write(run_dir / OUTPUTS.format(split=split), "".join(
        json.dumps(row_json(row), ensure_ascii=False) + "\n" for row in rows))


def read_outputs(run_dir: Path, classify: bool) -> dict[str, list[tuple[str, Prediction, str]]]:
    """Split -> the outputs of each outputs-SPLIT.jsonl the run holds."""
    before, after = OUTPUTS.split("{split}")
    outputs = {}
    for path in Path(run_dir).glob(OUTPUTS.format(split="*")):
        try:
            outputs[path.name.removeprefix(before).removesuffix(after)] = [
                row_from_json(r, classify) for r in ckpt.read_jsonl(path)]
        except (LookupError, TypeError, ValueError) as e:
            raise TaskformerError(f"{path}: not a taskformer outputs file ({type(e).__name__}: {e})") from None
    return outputs


def read_metrics(run_dir: Path) -> list[dict]:
    """Every event the run logged, oldest first (none before it has logged one)."""
    path = metrics_path(run_dir)
    return ckpt.read_jsonl(path) if path.exists() else []


@dataclass
class MetricsLog:
    """metrics.jsonl as the training engine writes it: the :class:`~taskformer.core.engine.EventLog`
    that the application hands to its :class:`~taskformer.core.engine.Trainer`."""

    run_dir: Path

    def append(self, event: dict) -> None:
        ckpt.append_line(metrics_path(self.run_dir), json.dumps(event))

    def drop_after(self, step: int) -> None:
        """Keep the events up to ``step`` (a resumed run's checkpoint): those logged after it, by the
        process that was lost, are logged again by the resumed one."""
        log = metrics_path(self.run_dir)
        if not log.exists():
            return
        text = ckpt.read_bytes(log).decode("utf-8", errors="replace")
        kept, lines = [], text.splitlines()
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line) if line.strip() else {}
            except (ValueError, RecursionError):
                row = None
            logged = row.get("step", 0) if isinstance(row, dict) else None
            if type(logged) is not int:
                if number == len(lines) and not text.endswith("\n"):
                    continue  # lines are appended whole with their newline: a killed append leaves only this
                raise TaskformerError(f"{log}: line {number} is not a JSON object with a whole-number step; "
                                      "the log is damaged")
            if logged <= step and line.strip():
                kept.append(line)
        ckpt.atomic_write(log, "".join(line + "\n" for line in kept))


def last_checkpoint(run_dir: Path) -> Path | None:
    """The run's newest resumable checkpoint (None before its first)."""
    return ckpt.latest_training_state(Path(run_dir) / ckpt.CHECKPOINTS)


def find_runs(root: Path) -> list[dict]:
    """Every run under ``root`` (any depth), newest first: ``finished`` (it has result.json),
    ``running`` (a process holds its lock) or ``unfinished`` (stopped before the end: resume it).
    A run whose files cannot be read is skipped with a warning naming the file."""
    runs = []
    # os.walk passes over what cannot be listed or vanishes while it looks (a process's entry in /proc)
    # and follows no link.
    found = (Path(where) for where, _, files in os.walk(root) if {RESULT, CONFIG} & set(files))
    for folder in sorted(found):
        path = folder / (RESULT if (folder / RESULT).exists() else CONFIG)
        try:
            saved = ckpt.read_json(path)
            if path.name == CONFIG:
                if not (isinstance(saved, dict) and isinstance(saved.get("task"), str) and "config" in saved):
                    continue  # another tool's config.json (a CTranslate2 export, say): not a run
                started = dt.datetime.fromtimestamp(path.stat().st_mtime).isoformat(timespec="seconds")
                runs.append({"path": str(folder), "task": saved["task"],
                             "status": "running" if is_locked(folder) else "unfinished",
                             "date": started, "wall_seconds": None, "metric": None, "metrics": {}})
                continue
            result = ResultRecord.parse(saved)
            if "test" not in result.metrics:  # a result without a test score is malformed too
                raise ValueError("metrics is not what taskformer writes")
            runs.append({"path": str(folder), "task": result.task, "status": "finished",
                         "date": result.info.get("date", ""), "wall_seconds": result.info.get("wall_seconds"),
                         "metric": result.metric, "metrics": result.metrics})
        except (TaskformerError, OSError, ValueError, LookupError, TypeError, AttributeError) as e:
            warnings.warn(f"skipped {path}: not a readable taskformer {path.stem} ({type(e).__name__}: {e})", stacklevel=2)
    return sorted(runs, key=lambda r: (r["date"], r["path"]), reverse=True)
