"""The folder a new run is written to (``--out``, else ``runs/TASK/<time>``): what it may be, checked
before any work; its creation, lock and marker; and the clearing of what a run that stopped before its
first checkpoint left there (it cannot be resumed, so a new run takes its place). A folder is cleared
only where it carries taskformer's marker: never because its files look like a run's.

The run directory's files and records are :mod:`taskformer.app.rundir`'s; this module asks it for them.
"""
from __future__ import annotations

import datetime as dt
import os
import shutil
from contextlib import ExitStack, suppress
from pathlib import Path

from taskformer.app.rundir import CONFIG, MARKER, METRICS, TOKENIZER, last_checkpoint, locked, mark_run, read_config, run_mark
from taskformer.core import checkpoint as ckpt
from taskformer.core.errors import TaskformerError


def default_run_dir(task: str) -> Path:
    """A new, empty ``runs/TASK/<time>``; runs started in the same second get ``<time>-2``, ``-3``, ...
    The directory is created here, exclusively, so two processes can never be handed the same one."""
    stamp = Path("runs") / task / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    make_dir(stamp.parent, exist_ok=True)
    path, n = stamp, 1
    while not make_dir(path, exist_ok=False):
        n += 1
        path = stamp.with_name(f"{stamp.name}-{n}")
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


STARTED = {MARKER, CONFIG, TOKENIZER, METRICS, ckpt.CHECKPOINTS}  # written before a checkpoint


def failed_before_checkpoint(path: Path, kept: frozenset[str] = frozenset(),
                             also: frozenset[str] = frozenset()) -> list[Path] | None:
    """What a run that stopped before its first checkpoint left in ``path`` (it cannot be resumed, so
    a new run may replace it), or None if ``path`` holds anything else. That is :data:`STARTED`, the
    best weights of its first evaluation beside its config.json, and temporary files of writes that
    were cut short. The files named in ``kept`` are the run's too, and stay, with the marker (a
    distillation's teacher outputs, from which its student begins again); those in ``also`` are
    counted as its own (a new distillation clears an earlier one's outputs)."""
    stays = kept | {MARKER} if kept else frozenset()
    ours = STARTED - stays | also | ({ckpt.WEIGHTS} if (path / CONFIG).is_file() else set())
    temporary = tuple(f".{name}." for name in ours | stays)  # atomic_write's names: .NAME.<random>.tmp
    entries = [p for p in path.iterdir() if p.name not in stays]
    left = [p for p in entries if p.name in ours or (p.name.startswith(temporary) and p.name.endswith(".tmp"))]
    if len(left) < len(entries) or last_checkpoint(path):
        return None
    return left


def holds_run(path: Path) -> bool:
    """Whether ``path`` is a taskformer run: it carries our marker, or (runs written before the marker)
    a taskformer config.json recording a run id. Only a marked run is ever cleared."""
    if run_mark(path):
        return True
    try:
        return read_config(path).binding is not None
    except TaskformerError:
        return False


def missing_folders(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def remove_started(path: Path, kept: frozenset[str] = frozenset(), also: frozenset[str] = frozenset()) -> bool:
    """Remove what a marked run that stopped before its first checkpoint left in ``path`` (see
    :func:`failed_before_checkpoint`); False, with nothing removed, where ``path`` holds anything else."""
    left = failed_before_checkpoint(path, kept, also) if run_mark(path) else None
    for entry in sorted(left or [], key=lambda p: p.name == MARKER):  # the marker last: until then the folder is ours
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return left is not None


def new_run_dir(task: str, out: str | None, lock: ExitStack, leftovers: frozenset[str] = frozenset()) -> Path:
    """The run directory, created, locked for this process (see :func:`locked`) and
    marked as ours (:func:`mark_run`). ``--out`` may name a new or empty folder, or a
    marked run that stopped before its first checkpoint (it starts afresh); anything else is refused
    with nothing in it changed: a folder is never cleared because its files look like a run's.

    A run that fails before its first checkpoint cannot be resumed, so what it wrote is removed
    when ``lock`` closes on the error, and so are the folders it created (an empty ``--out`` that
    was there before stays, empty). ``leftovers``: files such a run may have left too, cleared (a distillation's)."""
    made = missing_folders(Path(out) if out else Path("runs") / task)
    path = Path(out) if out else default_run_dir(task)
    made = made if out else [path, *made]
    make_dir(path, exist_ok=True)
    lock.enter_context(locked(path))
    remove_started(path, also=leftovers)  # a run that stopped before its first checkpoint: start afresh
    refuse_taken(path)
    mark_run(path)

    def discard(failed, *_) -> bool:  # called as ``lock`` closes, before the lock is released
        with suppress(OSError):  # a folder no longer writable: its files stay, for a new run with this --out to clear
            if failed is not None and remove_started(path):
                remove_empty(made)
        return False  # the error goes on to the user

    lock.push(discard)
    return path


def refuse_taken(path: Path) -> None:
    """Refuse an ``--out`` that holds anything: a run (to resume instead), or files of yours."""
    if holds_run(path):
        raise TaskformerError(f"{path} already holds a run; choose another --out or resume it with --resume {path} "
                              "(nothing in it was changed)")
    if any(path.iterdir()):
        raise TaskformerError(f"{path} is not empty and holds no taskformer run; --out must name a new or empty "
                              "folder (nothing in it was changed)")


def check_out(out: str | None, task: str, leftovers: frozenset[str] = frozenset()) -> None:
    """Refuse, changing nothing, an ``--out`` that :func:`new_run_dir` would refuse (``leftovers`` as it
    takes them) or could not write (a probe file, removed at once): before any work, and by a dry run."""
    path = Path(out) if out else Path("runs") / task
    there = next(p for p in (path, *path.parents) if os.path.lexists(p))  # where the run's first write lands
    if not there.is_dir():
        raise TaskformerError(f"{path}: cannot create the run directory ({there} is not a directory)" if there != path
                              else f"{path}: exists and is not a directory")
    if out and there == path and not (run_mark(path) and failed_before_checkpoint(path, also=leftovers) is not None):
        refuse_taken(path)  # else a new run starts afresh there
    try:
        ckpt.probe_write(there)
    except OSError as e:
        raise TaskformerError(f"cannot write {there} ({e.strerror}); --out must name a folder that can be written") from None


def remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) while they are empty; one that holds anything stays, and so do its parents."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break
