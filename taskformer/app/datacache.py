"""Prepared data, cached: a task's data hook and the encoding of its splits run once per input.

Reading, cleaning and tokenizing a large data set (couplet's 770,000 pairs) takes minutes, and a run
does it again every time. The first run of a command saves what the data hook returned (the splits,
the trained tokenizer, labels, notes) and each split's ids in a user cache folder; later runs with
the same inputs read them back in seconds.

The key is everything the hook and the encoding could depend on: the task, its plugin and the
plugin's version, the whole configuration the hook receives, the tokenizer a resumed run hands it,
and the SHA-256 of every file under ``--data-dir``. A changed file, option or plugin version is a
new key, never a stale entry. Only runs with a ``--data-dir`` are cached (a hub download has its
own cache; synthetic data is made in milliseconds). The cache holds JSON and safetensors, never
pickles, and is written atomically; ``TASKFORMER_CACHE`` moves it, ``TASKFORMER_CACHE=off`` turns
it off. The newest :data:`KEEP` entries are kept; only entries carrying the cache's mark are pruned.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import cast

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from taskformer.app.rundir import TOKENIZER  # an entry names its tokenizer as a run does
from taskformer.core import checkpoint as ckpt
from taskformer.core import progress
from taskformer.core.config import RunConfig
from taskformer.core.data import Encoded, TaskData, encode
from taskformer.plugins.hookspecs import Task

KEEP = 8  # cache entries kept, newest first: a few data sets and settings a person moves between
MARK = ".taskformer-data"  # in each entry folder this module wrote
VERSION = 1  # of the entry's format


def root() -> Path | None:
    """The cache folder, or None when caching is off."""
    chosen = os.environ.get("TASKFORMER_CACHE", "")
    if chosen.lower() == "off":
        return None
    base = Path(chosen) if chosen else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "taskformer"
    return base / "data"


def files_digest(data_dir: Path) -> str:
    """SHA-256 over the relative path and contents of every regular file under ``data_dir``."""
    digest = hashlib.sha256()
    data_dir = Path(data_dir)
    found = [data_dir] if data_dir.is_file() else sorted(p for p in data_dir.rglob("*") if p.is_file())
    for path in found:  # a --data file is its own single entry
        name = path.name if path == data_dir else str(path.relative_to(data_dir))
        digest.update(name.encode("utf-8", "surrogateescape") + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def key(task: Task, config: RunConfig, data_dir: Path, tokenizer: Tokenizer | None) -> str:
    try:
        version = metadata.version(task.plugin)
    except (metadata.PackageNotFoundError, ValueError):
        version = metadata.version("taskformer")  # a built-in task, or a plugin registered by hand
    parts = {"format": VERSION, "task": task.name, "plugin": task.plugin, "version": version,
             "config": config.to_dict(), "files": files_digest(data_dir),
             "tokenizer": tokenizer.to_str() if tokenizer is not None else None}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def load(task: Task, config: RunConfig, data_dir: str | None, hook, tokenizer: Tokenizer | None = None) -> TaskData:
    """``hook()`` (the checked data hook), or what it returned for the same inputs before."""
    folder = root()
    if folder is None or data_dir is None or str(data_dir).startswith("hub:"):  # the hub has its own cache
        return hook()
    with progress.stage("checking the data cache"):
        entry = folder / key(task, config, Path(data_dir), tokenizer)
    data = None
    if (entry / MARK).is_file():
        with progress.stage("reading the prepared data from the cache"):
            try:
                data = read_entry(entry)
                os.utime(entry)  # recently used: kept longest
            except Exception:  # a damaged entry (any library's error) is made again, never trusted
                shutil.rmtree(entry, ignore_errors=True)
    if data is None:
        data = hook()
        write_entry(entry, data)
    data.__dict__["_cache_entry"] = entry
    return data


def encoded(data: TaskData, split: str, max_len: int, variant: str) -> Encoded:
    """``encode(...)``, once per data set in memory and once per cache entry on disk."""
    memo = data.__dict__.setdefault("_encoded", {})
    name = f"{split}-{max_len}-{variant}"
    if name in memo:
        return memo[name]
    entry = data.__dict__.get("_cache_entry")
    path = entry / f"encoded-{name}.safetensors" if entry else None
    if path and path.is_file():
        memo[name] = read_encoded(path)
    else:
        memo[name] = encode(data, split, max_len, variant)
        if path and (path.parent / MARK).is_file():
            write_encoded(path, memo[name])
    return memo[name]


def read_entry(entry: Path) -> TaskData:
    saved = ckpt.read_json(entry / "data.json")
    splits = {split: [(tuple(row[0]) if isinstance(row[0], list) else row[0], *row[1:]) for row in rows]
              for split, rows in saved["splits"].items()}  # JSON keeps a pair of texts as a list
    tokenizer = Tokenizer.from_str(ckpt.read_bytes(entry / TOKENIZER).decode("utf-8"))
    return TaskData(tokenizer=tokenizer, splits=splits, labels=saved["labels"], notes=saved["notes"])


def write_entry(entry: Path, data: TaskData) -> None:
    """The entry, whole or not at all: written in a temporary folder, renamed into place, marked last."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-"))
    try:
        fields = asdict(data)
        saved = {"splits": {s: [list(row) for row in rows] for s, rows in data.splits.items()},
                 "labels": fields["labels"], "notes": fields["notes"]}
        (tmp / "data.json").write_text(json.dumps(saved, ensure_ascii=False, default=str), encoding="utf-8")
        (tmp / TOKENIZER).write_text(data.tokenizer.to_str(), encoding="utf-8")
        (tmp / MARK).write_text(json.dumps({"format": VERSION, "key": entry.name}), encoding="utf-8")
        os.replace(tmp, entry)
    except OSError:  # a cache that cannot be written costs time, never the run
        shutil.rmtree(tmp, ignore_errors=True)
        return
    prune(entry.parent)


def read_encoded(path: Path) -> Encoded:
    tensors = load_file(path)
    meta = json.loads(ckpt.read_bytes(path.with_suffix(".json")))

    def rows(name: str) -> list[list[int]]:
        return [r.tolist() for r in torch.split(tensors[name], tensors[f"{name}_lengths"].tolist())]

    tgt = rows("tgt") if meta["nested"] else tensors["tgt"].tolist()
    owners = rows("owners") if "owners" in tensors else None  # a language model's: see encode_text
    stream = tensors["stream"].tolist() if "stream" in tensors else None
    soft = tensors["soft"].tolist() if "soft" in tensors else None
    return Encoded(rows("src"), tgt, meta["truncated"], meta["target_pad"], owners, stream, meta.get("block", 0),
                   soft)


def write_encoded(path: Path, enc: Encoded) -> None:
    nested = bool(enc.tgt) and isinstance(enc.tgt[0], list)
    tensors = {"src": torch.tensor([t for row in enc.src for t in row], dtype=torch.int32),
               "src_lengths": torch.tensor([len(row) for row in enc.src], dtype=torch.int64)}
    if nested:
        targets = cast("list[list[int]]", enc.tgt)
        tensors.update(tgt=torch.tensor([t for row in targets for t in row], dtype=torch.int32),
                       tgt_lengths=torch.tensor([len(row) for row in targets], dtype=torch.int64))
    else:
        tensors["tgt"] = torch.tensor(enc.tgt, dtype=torch.int64)
    if enc.owners is not None:
        tensors.update(owners=torch.tensor([t for row in enc.owners for t in row], dtype=torch.int64),
                       owners_lengths=torch.tensor([len(row) for row in enc.owners], dtype=torch.int64))
    if enc.stream:
        tensors["stream"] = torch.tensor(enc.stream, dtype=torch.int32)
    if enc.soft is not None:
        tensors["soft"] = torch.tensor(enc.soft, dtype=torch.float32)
    try:
        ckpt.atomic_write(path.with_suffix(".json"), json.dumps(
            {"nested": nested, "truncated": enc.truncated, "target_pad": enc.target_pad, "block": enc.block}))
        save_file(tensors, str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)
    except OSError:
        Path(str(path) + ".tmp").unlink(missing_ok=True)


def prune(folder: Path) -> None:
    """Keep the newest :data:`KEEP` entries. Only what this module named and wrote is removed: a folder
    (not a link) named as a key, whose mark (not a link) holds that key; anything else is the user's."""
    entries = sorted((p for p in folder.iterdir() if ours(p)), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)


def ours(entry: Path) -> bool:
    """Whether ``entry`` is a cache entry this module wrote (see :func:`prune`)."""
    mark = entry / MARK
    if not re.fullmatch(r"[0-9a-f]{32}", entry.name) or entry.is_symlink() or not entry.is_dir() \
            or mark.is_symlink() or not mark.is_file():
        return False
    try:
        return json.loads(mark.read_text(encoding="utf-8")) == {"format": VERSION, "key": entry.name}
    except (OSError, ValueError):
        return False
