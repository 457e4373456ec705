"""Checkpoints and weights, written atomically and loaded without executing code; the atomic
writes and bounded reads every run file goes through.

The run directory, its files and their records are the application's, :mod:`taskformer.app.rundir`.
This module lays out the two things in it that the training engine writes, the best weights
(``model.safetensors``) and the checkpoints folder::

    checkpoints/step-N/  last training states for --resume: weights, optimizer, trainer state, mark
    checkpoints/evaluated/step-N.safetensors
                         with train.average_last=N: the weights of the last N evaluations, averaged

and lists and prunes that folder by the exact names it writes (:func:`training_states`).

Weights and optimizer state are safetensors (a plain tensor container: loading it cannot run
code; see :mod:`taskformer.core.optimizer_state`). Every file is written to a temporary name in the
same directory and renamed into place, so a crash mid-write leaves the previous file intact.
A run's weights carry a stamp in their metadata (task, run id, tokenizer hash) that must match the
record in its config.json: files from different runs are never mixed (:func:`check_stamp`).
"""
from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
import stat
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, load_model, save_file, save_model

from taskformer.core import compat, optimizer_state
from taskformer.core.errors import TaskformerError

WEIGHTS = "model.safetensors"
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # safetensors' names of the dtypes weights may have


class WriteFailed(TaskformerError):
    """A run directory could not be written: read-only, not permitted, a file too large (see :func:`disk_space`)."""


class DiskFull(WriteFailed):
    """The disk filled up while a run directory was written (see :func:`disk_space`)."""


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write a whole file or nothing: temp file in the same directory, fsync, rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates owner-only files; a run directory is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def probe_write(folder: Path) -> None:
    """Write a few bytes into ``folder`` and remove them: an OSError now, before any work, where a
    run's files could not be written there (read-only, denied, full). The probe is a new file
    (created exclusively, so never a link), named as no one else's file is, and always removed."""
    fd, probe = tempfile.mkstemp(dir=folder, prefix=".taskformer-probe.", suffix=".tmp")
    try:
        os.write(fd, b"taskformer\n")
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(probe)


def append_line(path: Path, line: str) -> None:
    """Append one line to a log (a run's events): too small and frequent a write to rename a copy of
    the whole file, so a link at ``path`` is refused (O_NOFOLLOW) instead of written through."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise TaskformerError(f"{path}: a link, not a file; taskformer writes its run files itself") from None
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


MAX_RUN_FILE = 1 << 30  # bytes; far more than any file taskformer writes into a run directory


def read_bytes(path: Path, limit: int = MAX_RUN_FILE) -> bytes:
    """A run file's contents, read only from a regular file of at most ``limit`` bytes: a FIFO would
    block, a link to /dev/zero never end, and a huge file fill the memory."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise TaskformerError(f"{path}: not a regular file (is this a taskformer run directory?)")
        with open(path, "rb") as f:
            data = f.read(limit + 1)  # bounded even if the file grows after the stat
    except FileNotFoundError:
        raise TaskformerError(f"{path}: not found (is this a taskformer run directory?)") from None
    except OSError as e:
        raise TaskformerError(f"{path}: cannot read ({e.strerror})") from None
    if max(info.st_size, len(data)) > limit:
        raise TaskformerError(f"{path}: {max(info.st_size, len(data)):,} bytes, more than the {limit:,} a run "
                              "file may have; this is not a file taskformer wrote")
    return data


def read_json(path: Path) -> dict:
    try:
        return json.loads(read_bytes(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TaskformerError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise TaskformerError(f"{path}: nested too deeply to be a file taskformer wrote") from None


def read_jsonl(path: Path) -> list[dict]:
    """One JSON object per line (a run's log, its outputs); a damaged line is named, file and line."""
    try:
        lines = read_bytes(path).decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise TaskformerError(f"{path}: cannot read ({e})") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskformerError(f"{path}:{number}: damaged line, not JSON ({e.msg}); was the file truncated?") from None
        if not isinstance(row, dict):
            raise TaskformerError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def synced(*paths: Path) -> None:
    """fsync what a library wrote (safetensors' writer does not), before a rename publishes it: a crash
    then never leaves a named file whose bytes were not yet on the disk, and a disk that fills late
    (the error comes when the data is flushed) fails the write here, not after the rename."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_weights(model: torch.nn.Module | dict[str, torch.Tensor], path: Path,
                 stamp: dict[str, str] | None = None) -> None:
    """Atomically save weights; tied matrices are stored once (safetensors refuses aliases).

    A dict of tensors read from such files (e.g. :func:`average_weights`) is saved as it is.
    ``stamp`` goes into the file's metadata (see :func:`check_stamp`).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        if isinstance(model, torch.nn.Module):
            save_model(model, tmp, metadata=stamp)
        else:
            save_file(model, tmp, metadata=stamp)
        synced(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load safetensors weights strictly: a truncated file, a missing tensor or a wrong shape is refused."""
    path = Path(path)
    if not path.is_file():
        raise TaskformerError(f"{path}: no weights found")
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    try:
        with safe_open(path, "pt") as f:
            for key in f.keys():
                shape = tuple(f.get_slice(key).get_shape())
                if key in expected and shape != expected[key]:
                    raise TaskformerError(f"{path}: weights do not match the model ({key} is {list(shape)} "
                                          f"in the file, {list(expected[key])} in the model built from config.json)")
                dtype = f.get_slice(key).get_dtype()
                if dtype not in FLOAT_DTYPES:
                    raise TaskformerError(f"{path}: tensor {key} is stored as {dtype}; weights must be floating "
                                          f"point ({', '.join(FLOAT_DTYPES)})")
        missing, unexpected = load_model(model, path, strict=False)
    except (SafetensorError, RuntimeError, OSError, ValueError) as e:
        try:
            path.open("rb").close()  # safetensors calls a file it may not read "No such file or directory"
        except OSError as unreadable:
            raise TaskformerError(f"{path}: cannot read the weights ({unreadable.strerror})") from None
        raise TaskformerError(f"{path}: corrupt or incompatible weights ({str(e).splitlines()[0]})") from None
    if missing or unexpected:
        raise TaskformerError(f"{path}: weights do not match the model "
                              f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    bad = non_finite(model)
    if bad:
        raise TaskformerError(f"{path}: tensor {bad} holds NaN or infinite values; refusing broken weights")


def sha256(path: Path) -> str:
    """The SHA-256 of a regular file, read in blocks (a FIFO or device is refused, not read)."""
    path = Path(path)
    if not path.is_file():
        raise TaskformerError(f"{path}: {'not a regular file' if path.exists() else 'not found'} "
                              "(is this a taskformer run directory?)")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def check_stamp(path: Path, expected: dict[str, str], config: Path) -> None:
    """Refuse weights whose metadata stamp (task, run id, tokenizer and architecture hashes) is not
    the one ``config`` records: weights of another task, another run or another tokenizer would
    load without a complaint when their shapes agree, and predict nonsense."""
    path = Path(path)
    try:
        with safe_open(path, "pt") as f:
            stamp = f.metadata() or {}
    except (SafetensorError, OSError) as e:
        raise TaskformerError(f"{path}: corrupt or unreadable weights ({str(e).splitlines()[0]})") from None
    if not stamp.get("run"):
        raise TaskformerError(f"{path}: the weights carry no run record, but {config} has one; they do not "
                              "come from this run")
    if stamp.get("task") != expected["task"]:
        raise TaskformerError(f"{path}: weights of task {stamp.get('task')!r}, but {config} names task "
                              f"{expected['task']!r}; the weights and config.json come from different runs")
    if stamp["run"] != expected["run"]:
        raise TaskformerError(f"{path}: weights of another run (run id {stamp['run'][:12]}, {config} records "
                              f"{expected['run'][:12]}); a run directory must hold its own weights")
    if stamp.get("tokenizer_sha256") != expected["tokenizer_sha256"]:
        raise TaskformerError(f"{path}: weights trained with another tokenizer than the one {config} records")
    if not compat.architecture_unchecked(stamp) and stamp["model_sha256"] != expected.get("model_sha256"):
        raise TaskformerError(f"{config}: its model section or labels are not the ones {path.name} was trained with "
                              "(they are fixed when a run starts); put the run's own config.json back")


def non_finite(model: torch.nn.Module) -> str | None:
    """The name of the first parameter holding a NaN or infinity, or None when all are finite."""
    return next((name for name, p in model.state_dict().items()
                 if p.is_floating_point() and not torch.isfinite(p).all()), None)


def average_weights(paths: list[Path]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the weights files ``paths`` (checkpoint averaging, paper section 6.1).

    Sums in float32, one file in memory at a time, and casts each mean back to the tensor's own
    dtype, so bf16 or fp16 weights lose nothing to rounding while adding. Integer tensors are
    counters rather than weights: the newest file's values are kept. A tied matrix is stored once
    in the files (see :func:`save_weights`), so it is averaged once and loads into every name.
    """
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path in paths:
        try:
            tensors = load_file(path)
        except (SafetensorError, OSError) as e:
            raise TaskformerError(f"{path}: corrupt or unreadable weights ({str(e).splitlines()[0]})") from None
        if total and {k: t.shape for k, t in tensors.items()} != {k: t.shape for k, t in total.items()}:
            raise TaskformerError(f"{path}: holds other tensors than {paths[0]}; only weights of one model average")
        for key, t in tensors.items():
            dtypes[key] = t.dtype
            if not t.is_floating_point() or key not in total:
                total[key] = t.float() if t.is_floating_point() else t
            else:
                total[key] += t.float()
    return {k: (t / len(paths)).to(dtypes[k]) if dtypes[k].is_floating_point else t for k, t in total.items()}


CHECKPOINTS = "checkpoints"  # in a run directory: the folder this module lays out, lists and prunes
EVALUATED = Path(CHECKPOINTS) / "evaluated"  # in a run directory: the weights kept for averaging

# What taskformer writes under checkpoints/, by exact name. Anything else there (``step-1-notes/``, a
# link, a file) is the user's: never listed, loaded or pruned.
TRAINING_STATE_NAME = re.compile(r"step-(\d{9})")
EVALUATED_NAME = re.compile(r"step-(\d{9})\.safetensors")
CHECKPOINT_MARK = ".taskformer-checkpoint"  # in each checkpoint folder taskformer wrote, from 2026-11-26


def _refuse_links(run_dir: Path, folder: Path) -> None:
    """Refuse ``folder`` if it, or a folder between it and ``run_dir``, is a symbolic link: writing, and
    later pruning, through it would touch a folder of the user's elsewhere."""
    for part in [folder, *folder.parents]:
        if part == run_dir or part in run_dir.parents:
            return
        if part.is_symlink():
            raise TaskformerError(f"{part} is a symbolic link; taskformer reads and writes no run file through "
                                  "a link (nothing was written: replace the link with a folder)")


def _own_folder(run_dir: Path, folder: Path) -> Path:
    """``folder`` of ``run_dir``, made if missing, as a place taskformer may write into (no link on the way)."""
    _refuse_links(run_dir, folder)
    if not run_dir.is_dir():  # removed while training: not made again, so the write fails and says so
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(run_dir))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _ours(run_dir: Path, folder: Path, name: re.Pattern, kind, mark: str | None = None) -> dict[int, Path]:
    """Step -> each entry of ``folder`` that taskformer wrote, oldest first: the exact name, the
    expected kind of file (``lstat``: a link is never ours) and, for a checkpoint folder, its mark.
    An entry with our exact name that is not ours is named in a warning and left alone."""
    _refuse_links(run_dir, folder)
    found = {}
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = name.fullmatch(entry.name)
        if not match:
            continue
        try:
            info = os.lstat(entry)
        except FileNotFoundError:  # pruned by a process finishing beside us
            continue
        if kind(info.st_mode) and (mark is None or (entry / mark).is_file() or compat.unmarked_checkpoint(entry)):
            found[int(match[1])] = entry
        else:
            warnings.warn(f"{entry} is not a checkpoint taskformer wrote; it was left alone", stacklevel=2)
    return found


def evaluated_weights(run_dir: Path) -> dict[int, Path]:
    """Step -> weights file of each evaluation kept under ``checkpoints/evaluated/``, oldest first."""
    return _ours(Path(run_dir), Path(run_dir) / EVALUATED, EVALUATED_NAME, stat.S_ISREG)


def keep_evaluated(model: torch.nn.Module, run_dir: Path, step: int, keep: int) -> None:
    """Save the weights just evaluated at ``step``; prune to the newest ``keep``."""
    folder = _own_folder(Path(run_dir), Path(run_dir) / EVALUATED)
    save_weights(model, folder / f"step-{step:09d}.safetensors")
    for old in list(evaluated_weights(run_dir).values())[:-keep]:
        old.unlink(missing_ok=True)


def load_average(model: torch.nn.Module, paths: list[Path]) -> None:
    """Load the mean of ``paths`` into ``model``, through a file: it is checked, and tied matrices
    filled, exactly as when loading ``model.safetensors``."""
    with tempfile.TemporaryDirectory() as tmp:
        save_weights(average_weights(paths), Path(tmp) / WEIGHTS)
        load_weights(model, Path(tmp) / WEIGHTS)


def weights_name(steps: list[int]) -> str:
    """What the report calls a set of kept weights: one checkpoint, or the average of several."""
    if len(steps) == 1:
        return f"step {steps[0]}"
    return f"average of last {len(steps)} checkpoints (steps {steps[0]}..{steps[-1]})"


def refuse_pickles(run_dir: Path) -> None:
    """A run directory must not carry pickle files beside its weights: we never load them, and
    their presence means the directory did not come from taskformer as it is."""
    for p in Path(run_dir).glob("*"):
        if p.suffix.lower() in PICKLE_SUFFIXES:  # MODEL.PT is as much a pickle as model.pt
            raise TaskformerError(f"{p}: refusing a run directory that holds a pickle file; "
                                  "taskformer stores weights only as safetensors")


def save_training_state(ckpt_root: Path, step: int, model, optimizer, scheduler, state: dict, keep: int,
                        stamp: dict[str, str] | None = None) -> Path:
    """Write ``checkpoints/step-N`` through a temporary directory, then prune to the newest ``keep``
    of the checkpoints taskformer wrote (:func:`training_states`)."""
    ckpt_root = _own_folder(Path(ckpt_root).parent, Path(ckpt_root))
    final = ckpt_root / f"step-{step:09d}"
    if os.path.lexists(final) and final not in training_states(ckpt_root).values():
        raise TaskformerError(f"{final} exists and is not a checkpoint taskformer wrote; move it away to save "
                              "this checkpoint (nothing was written)")
    tmp = Path(tempfile.mkdtemp(dir=ckpt_root, prefix=".tmp-"))
    try:
        save_model(model, str(tmp / WEIGHTS), metadata=stamp)
        optimizer_state.save(tmp / optimizer_state.FILE, optimizer, scheduler)
        (tmp / "state.json").write_text(json.dumps(state), encoding="utf-8")
        (tmp / CHECKPOINT_MARK).write_text(json.dumps({"step": step}), encoding="utf-8")
        synced(*tmp.iterdir(), tmp)
        if final.exists():  # ours (checked above): the same step saved again (its stop reason, a resumed run)
            _remove(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list(training_states(ckpt_root).values())[:-keep]:
        _remove(old)
    return final


def _remove(folder: Path) -> None:
    """Remove a checkpoint folder as one step: it is renamed into a temporary folder first, so a kill
    while its files are deleted leaves no half of a checkpoint under its name (one that a resume
    would load, or take for the user's and refuse to replace)."""
    trash = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-"))
    try:
        os.replace(folder, trash / folder.name)
    finally:
        shutil.rmtree(trash, ignore_errors=True)


def training_states(ckpt_root: Path) -> dict[int, Path]:
    """Step -> each resumable checkpoint folder taskformer wrote under ``ckpt_root``, oldest first."""
    return _ours(Path(ckpt_root).parent, Path(ckpt_root), TRAINING_STATE_NAME, stat.S_ISDIR, CHECKPOINT_MARK)


def latest_training_state(ckpt_root: Path) -> Path | None:
    states = list(training_states(ckpt_root).values())
    return states[-1] if states else None


def _count(value) -> bool:
    """A JSON count: a non-negative integer (``True`` is an int to Python, not to us)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value) -> bool:
    """A finite, non-negative JSON number."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf


def load_training_state(path: Path, model, optimizer, scheduler) -> dict:
    """Restore model, optimizer, schedule and RNG from ``checkpoints/step-N``; returns the trainer state."""
    load_weights(model, path / WEIGHTS)
    optimizer_state.load(path / optimizer_state.FILE, optimizer, scheduler)  # checked before anything is loaded
    state = read_json(path / "state.json")
    if not isinstance(state, dict):
        raise TaskformerError(f"{path / 'state.json'}: not a JSON object; the checkpoint is damaged")
    bad = next((k for k in ("step", "epoch", "batch", "tokens", "best_step", "stale") if not _count(state.get(k))), None)
    elapsed = state.get("elapsed")
    if bad or not isinstance(elapsed, (int, float)) or isinstance(elapsed, bool) or not 0 <= elapsed < math.inf:
        raise TaskformerError(f"{path / 'state.json'}: {bad or 'elapsed'} must be a non-negative number, "
                              f"got {state.get(bad or 'elapsed')!r}; the checkpoint is damaged")
    decay, timing = compat.checkpoint_state(state)["decay"], state["clock"]
    if not (decay == [] or (isinstance(decay, list) and len(decay) in (2, 3) and _count(decay[0]) and decay[0] >= 1
                            and all(_number(x) for x in decay[1:]))):
        raise TaskformerError(f"{path / 'state.json'}: decay must be [] or [first step, seconds of training(, the "
                              f"schedule's factor then)], got {decay!r:.80}; the checkpoint is damaged")
    estimates = timing.get("estimates", {}) if isinstance(timing, dict) else None
    if not (isinstance(estimates, dict) and all(isinstance(k, str) and _number(v) for k, v in estimates.items())
            and all(timing.get(k) is None or _number(timing[k]) for k in ("timed_at", "per_update"))):
        raise TaskformerError(f"{path / 'state.json'}: clock must be {{estimates: {{why: seconds}}, timed_at: seconds, "
                              f"per_update: seconds}}, got {timing!r:.80}; the checkpoint is damaged")
    best, kept = state.get("best"), state.get("best_weights", [])
    if not (best is None or (isinstance(best, list) and len(best) == 2
                             and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in best))):
        raise TaskformerError(f"{path / 'state.json'}: best must be null or [score, -loss], got {best!r:.80}; "
                              "the checkpoint is damaged")
    if not (isinstance(kept, list) and all(map(_count, kept))):
        raise TaskformerError(f"{path / 'state.json'}: best_weights must be a list of steps, got {kept!r:.80}; "
                              "the checkpoint is damaged")
    return state


# Failed writes other than a full disk, by errno and by the words a writer that keeps no errno uses
WRITE_ERRORS = {errno.EROFS: "Read-only file system", errno.EACCES: "Permission denied",
                errno.EFBIG: "File too large", errno.EIO: "Input/output error"}


@contextmanager
def disk_space(run_dir: Path, needed: int):
    """Report a full disk while writing ``run_dir`` as such, with what a checkpoint needs.

    Each writer says it its own way: Python raises ENOSPC, safetensors "No space left on device (os
    error 28)". Every write is atomic, so the files and checkpoints written before are intact.
    """
    try:
        yield
    except (OSError, RuntimeError, SafetensorError) as e:
        code = getattr(e, "errno", None)
        if why := next((sign for c, sign in WRITE_ERRORS.items() if c == code or sign in str(e)), None):
            raise WriteFailed(f"cannot write {run_dir} ({why})") from None
        if not Path(run_dir).is_dir():  # removed (or moved away) while it was written
            raise WriteFailed(f"cannot write {run_dir} (it no longer exists)") from None
        if getattr(e, "errno", None) not in (errno.ENOSPC, errno.EDQUOT) and not any(
                sign in str(e) for sign in ("No space left on device", "Disk quota exceeded")):
            raise
        mount = Path(run_dir).resolve()
        while mount.parent != mount and mount.parent.stat().st_dev == mount.stat().st_dev:
            mount = mount.parent
        raise DiskFull(f"no space left on {mount} (needed about {needed / 1e6:,.1f} MB for a checkpoint of "
                       f"{run_dir})") from None
