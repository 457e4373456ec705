"""Prepared data, cached: a task's data hook and the encoding of its splits run once per input.

Reading, cleaning and tokenizing a large data set (couplet's 770,000 pairs, millions of pairs of a
user's corpus) takes minutes, and a run would do it again every time. The first run saves what the
data hook returned and each split's ids in a user cache folder; later runs read them back in seconds.

An entry holds the tokenizer, labels and notes, the val and test rows (they are decoded and
scored as text), the train split's row count, and each encoded split as flat ``.npy`` arrays
(:mod:`taskformer.core.arrays`), opened memory-mapped: a warm start reads no token into Python
objects. The train rows' text is not kept; the rare command that needs it (a distillation decodes
the train sources) reads it again through the data hook.

The key is what the preparation reads: the task, its plugin and the plugin's version, the data
options and the seed (which may choose rows), the tokenizer a resumed run hands the hook, and the
SHA-256 of every file under ``--data-dir``. Training, model and decoding options are not part of it,
so a dry run and the run after it share one entry; the encoding's ``model.max_len`` and the task's
variant name the encoded arrays inside the entry. Only runs with a ``--data-dir`` are cached (a hub
download has its own cache; synthetic data is made in milliseconds).

What an entry holds is checked against its key before it is used: its mark names the key, and each
array's type, shape and SHA-256, its offsets and its ids' range are checked; an entry that fails is
made again. A cache that cannot be used at all (``TASKFORMER_CACHE`` at a file, a read-only folder)
costs time, never the run: one warning line says so. Entries are written whole or not at all; the
newest :data:`KEEP` are kept, up to ``TASKFORMER_CACHE_GB`` (default :data:`MAX_GB`) in all, and only
folders named and marked by this module are ever removed (never through a link).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from itertools import chain
from pathlib import Path
from typing import Any, cast

import numpy as np
from tokenizers import Tokenizer

from taskformer.app.resources import GZIP_RATIO, check_data_memory
from taskformer.app.rundir import TOKENIZER  # an entry names its tokenizer as a run does
from taskformer.core import checkpoint as ckpt
from taskformer.core import progress, variants
from taskformer.core.arrays import Ragged
from taskformer.core.config import RunConfig
from taskformer.core.data import IGNORE, Encoded, TaskData, encode
from taskformer.core.data import rows as read_rows
from taskformer.plugins.hookspecs import Task

KEEP = 8  # cache entries kept, newest first: a few data sets and settings a person moves between
MAX_GB = 20.0  # and their size in all, unless TASKFORMER_CACHE_GB says otherwise
MARK = ".taskformer-data"  # in each entry folder this module wrote: {"format": VERSION, "key": its name}
VERSION = 3  # of the entry's format (part of the key: an entry of another format is never read)
ENTRY = re.compile(r"[0-9a-f]{32}")  # an entry's folder name: its key


class Unusable(Exception):
    """An entry whose contents are not what its key promised."""


def root() -> Path | None:
    """The cache folder, or None when caching is off."""
    chosen = os.environ.get("TASKFORMER_CACHE", "")
    if chosen.lower() == "off":
        return None
    base = Path(chosen) if chosen else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "taskformer"
    return base / "data"


def max_bytes() -> float:
    try:
        return float(os.environ.get("TASKFORMER_CACHE_GB") or MAX_GB) * 1e9
    except ValueError:
        return MAX_GB * 1e9


def unusable(why: str) -> None:
    """One warning line: the cache is skipped or an entry rebuilt, and the run goes on."""
    warnings.warn(f"data cache: {why}", stacklevel=3)


def reason(e: BaseException) -> str:
    """An exception in a few words on one line (a library's message may span lines)."""
    words = " ".join((getattr(e, "strerror", None) or str(e)).split())
    return f"{type(e).__name__}: {words[:150]}" if words else type(e).__name__


def files(data_dir: Path) -> list[Path]:
    """The regular files of a data folder, or the one file ``--data`` names."""
    data_dir = Path(data_dir)
    return [data_dir] if data_dir.is_file() else sorted(p for p in data_dir.rglob("*") if p.is_file())


def text_bytes(data_dir: Path) -> int:
    """The bytes of text under ``data_dir``: a ``.gz`` file's size times :data:`GZIP_RATIO`."""
    return sum(p.stat().st_size * (GZIP_RATIO if p.suffix == ".gz" else 1) for p in files(data_dir))


def files_digest(data_dir: Path) -> str:
    """SHA-256 over the relative path and contents of every regular file under ``data_dir`` (or of that one file)."""
    digest = hashlib.sha256()
    for path in files(data_dir):
        name = path.name if path == Path(data_dir) else str(path.relative_to(data_dir))
        digest.update(name.encode("utf-8", "surrogateescape") + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def key(task: Task, config: RunConfig, digest: str, tokenizer: Tokenizer | None) -> str:
    """The entry's name: what the data hook and the encoding read, and nothing else."""
    try:
        version = metadata.version(task.plugin)
    except (metadata.PackageNotFoundError, ValueError):
        version = metadata.version("taskformer")  # a built-in task, or a plugin registered by hand
    parts = {"format": VERSION, "task": task.name, "plugin": task.plugin, "version": version,
             "data": config.to_dict()["data"], "seed": config.train.seed, "files": digest,
             "tokenizer": tokenizer.to_str() if tokenizer is not None else None}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


class Reread(Sequence):
    """A cache entry's train rows: their count is kept, and the rows are read again through the data
    hook the first time something asks for one (a distillation decodes them; training reads the
    cached arrays and never does)."""

    def __init__(self, count: int, hook: Callable[[], TaskData]):
        self.size, self.hook = count, hook
        self.rows: list | None = None

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i):
        if self.rows is None:
            self.rows = read_rows(self.hook().splits["train"])
        return self.rows[i]


def load(task: Task, config: RunConfig, data_dir: str | None, hook: Callable[[], TaskData],
         tokenizer: Tokenizer | None = None) -> TaskData:
    """``hook()`` (the checked data hook), or what it returned for the same inputs before."""
    folder = root()
    if data_dir is None or str(data_dir).startswith("hub:"):  # the hub has its own cache
        return hook()
    size = text_bytes(Path(data_dir))
    if folder is None:
        check_data_memory(data_dir, size)
        return hook()
    with progress.stage("checking the data cache"):
        entry = folder / key(task, config, files_digest(Path(data_dir)), tokenizer)
    data = None
    try:
        present = (entry / MARK).is_file()
    except OSError as e:  # a name too long, say
        unusable(f"cannot use {folder} ({reason(e)}); the data is prepared without it")
        check_data_memory(data_dir, size)
        return hook()
    if present:
        try:
            with progress.stage("reading the prepared data from the cache"):
                data = read_entry(entry, hook)
            os.utime(entry)  # recently used: kept longest
        except Exception as e:  # any library's error: a damaged entry is made again, never trusted
            unusable(f"entry {entry} is damaged ({reason(e)}); it is made again")
            discard(entry)
            data = None
    if data is None:
        check_data_memory(data_dir, size)
        data = hook()
        try:
            write_entry(entry, data)
        except OSError as e:
            unusable(f"cannot write to {folder} ({reason(e)}); the data is prepared without it")
            return data
    data.__dict__["_cache_entry"] = entry
    return data


def read_entry(entry: Path, hook: Callable[[], TaskData]) -> TaskData:
    check_mark(entry)
    saved = ckpt.read_json(entry / "data.json")
    if not written_data(saved):
        raise Unusable("its data.json is not what the cache writes")
    splits: dict[str, Sequence] = {split: [(tuple(row[0]) if isinstance(row[0], list) else row[0], *row[1:])
                                           for row in rows]  # JSON keeps a pair of texts as a list
                                   for split, rows in saved["splits"].items()}
    splits.update({split: Reread(count, hook) for split, count in saved["counts"].items()})
    tokenizer = Tokenizer.from_str(ckpt.read_bytes(entry / TOKENIZER).decode("utf-8"))
    return TaskData(tokenizer=tokenizer, splits=splits, labels=saved["labels"], notes=saved["notes"])


def written_data(saved: Any) -> bool:
    """Whether an entry's data.json holds what :func:`write_entry` writes: rows of texts, whole-number
    row counts, labels and notes. A value of another type would be trusted, and fail the run far from here."""
    return (isinstance(saved, dict) and text_splits(saved.get("splits")) and row_counts(saved.get("counts"))
            and label_names(saved.get("labels")) and isinstance(saved.get("notes"), dict))


def text_splits(splits: Any) -> bool:
    """Splits kept as their rows, each row a list as :func:`write_entry` writes a row: a source (a text,
    or a pair of texts), a target text, and the row's fields if it has any."""
    def row(r: Any) -> bool:
        if not (isinstance(r, list) and len(r) in (2, 3)):
            return False
        source, target, *fields = r
        pair = isinstance(source, list) and len(source) == 2 and all(isinstance(t, str) for t in source)
        return (isinstance(source, str) or pair) and isinstance(target, str) and all(isinstance(f, dict) for f in fields)
    return isinstance(splits, dict) and all(isinstance(rows, list) and all(map(row, rows)) for rows in splits.values())


def row_counts(counts: Any) -> bool:
    """Splits kept as their row count alone (train, read again from the data when needed)."""
    return isinstance(counts, dict) and all(type(n) is int and n >= 0 for n in counts.values())


def label_names(labels: Any) -> bool:
    """A classifier's labels, or none."""
    return labels is None or isinstance(labels, list) and all(isinstance(label, str) for label in labels)


def check_mark(entry: Path) -> None:
    """The entry is this module's, for the key it is named by (a swapped folder is not)."""
    mark = json.loads(ckpt.read_bytes(entry / MARK, limit=4096))
    if not (isinstance(mark, dict) and mark.get("format") == VERSION and mark.get("key") == entry.name):
        raise Unusable(f"its mark is not this key's ({str(mark)[:80]})")


def write_entry(entry: Path, data: TaskData) -> None:
    """The entry, whole or not at all: written in a temporary folder and renamed into place."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-"))
    try:
        text = {s: [list(row) for row in rows] for s, rows in data.splits.items() if s != "train"}
        counts = {s: len(rows) for s, rows in data.splits.items() if s == "train"}
        saved = {"splits": text, "counts": counts, "labels": data.labels, "notes": data.notes}
        (tmp / "data.json").write_text(json.dumps(saved, ensure_ascii=False, default=str), encoding="utf-8")
        (tmp / TOKENIZER).write_text(data.tokenizer.to_str(), encoding="utf-8")
        (tmp / MARK).write_text(json.dumps({"format": VERSION, "key": entry.name}), encoding="utf-8")
        if entry.is_dir() and not entry.is_symlink():
            discard(entry)  # a damaged entry of this key, unmarked
        os.replace(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    prune(entry.parent, entry)


def encoded(data: TaskData, split: str, max_len: int, variant: str) -> Encoded:
    """``encode(...)``, once per data set in memory and once per cache entry on disk."""
    memo = data.__dict__.setdefault("_encoded", {})
    name = f"encoded-{split}-{max_len}-{variant}"
    if name in memo:
        return memo[name]
    entry: Path | None = data.__dict__.get("_cache_entry")
    if entry is None:
        memo[name] = encode(data, split, max_len, variant)
        return memo[name]
    folder = entry / name
    limits = (data.tokenizer.get_vocab_size(), len(data.labels or []), variants.of(variant))
    try:
        if (folder / "meta.json").is_file():
            with progress.stage(f"opening the cached {split} arrays"):
                memo[name] = read_encoded(folder, entry.name, *limits)
            return memo[name]
    except Exception as e:  # any library's error: a damaged file is made again, never trusted
        unusable(f"{folder} is damaged ({reason(e)}); it is made again")
        discard(folder)
    memo[name] = encode(data, split, max_len, variant)
    if (entry / MARK).is_file():
        try:
            write_encoded(folder, entry.name, memo[name])
            prune(folder.parent.parent, folder.parent)
        except OSError as e:
            unusable(f"cannot write {folder} ({reason(e)}); the data is prepared without it")
    return memo[name]


def arrays_of(enc: Encoded) -> tuple[dict[str, np.ndarray], dict[str, list[str] | str]]:
    """An encoding's arrays by file name, and each field as the arrays it is made of (a flat array
    that several fields share, a language model's stream, is saved once)."""
    arrays: dict[str, np.ndarray] = {}
    names: dict[int, str] = {}

    def add(field: str, array: np.ndarray) -> str:
        if id(array) not in names:
            names[id(array)] = field
            arrays[field] = array
        return names[id(array)]

    fields: dict[str, list[str] | str] = {}
    if enc.stream is not None:
        fields["stream"] = add("stream", enc.stream)
    for field in ("src", "tgt", "owners", "soft"):
        value = getattr(enc, field)
        if isinstance(value, Ragged):
            fields[field] = [add(f"{field}.ids", value.flat), add(f"{field}.offsets", value.offsets)]
        elif value is not None:
            fields[field] = add(field, value)
    return arrays, fields


BLOCK = 1 << 24  # bytes of an array file written or read at once


def save(path: Path, array: np.ndarray) -> str:
    """``array`` as a ``.npy`` file, a block at a time; returns the file's SHA-256. An array mapped
    from a spilled file (:class:`~taskformer.core.arrays.Spilled`: a language model's token stream)
    is copied from that file: read through its mapping, every page of it would count as this
    process's memory."""
    spilled = getattr(array, "spilled", None)
    array = np.ascontiguousarray(array)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(array))
    if spilled is not None:
        spilled.seek(0)
        blocks: Iterable[bytes | memoryview] = iter(lambda: spilled.read(BLOCK), b"")
    else:
        flat = memoryview(cast(Any, array.reshape(-1).view(np.uint8)))  # as bytes, an empty (0, 2) array too
        blocks = (flat[start : start + BLOCK] for start in range(0, len(flat), BLOCK))
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        for block in chain([header.getvalue()], blocks):
            digest.update(block)
            out.write(block)
    return digest.hexdigest()


@dataclass
class Scanned:
    """What :func:`scan` read of an array file."""

    sha256: str
    dtype: np.dtype
    shape: tuple[int, ...]
    low: Any = None  # the smallest value, and the largest (None in an empty array)
    high: Any = None
    ascending: bool = True  # whether its values never decrease (offsets must not; checked for offsets only)


def scan(path: Path, offsets: bool = False) -> Scanned:
    """An array file's SHA-256, type, shape and range (and for ``offsets`` whether they ascend), read
    a block at a time: not through a mapping, so checking a large array costs no memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(f)
        if dtype.hasobject:
            raise Unusable(f"{path.name} holds Python objects")
        size = f.tell()
        f.seek(0)
        digest.update(f.read(size))
        out, last = Scanned("", dtype, shape), None
        for block in iter(lambda: f.read(BLOCK - BLOCK % dtype.itemsize), b""):
            digest.update(block)
            values = np.frombuffer(block, dtype)
            if not values.size:
                continue
            low, high = values.min(), values.max()
            out.low = low if out.low is None else min(out.low, low)
            out.high = high if out.high is None else max(out.high, high)
            if offsets:
                out.ascending = out.ascending and not (last is not None and values[0] < last) and bool(
                    np.all(values[1:] >= values[:-1]))
                last = values[-1]
    out.sha256 = digest.hexdigest()
    return out


def write_encoded(folder: Path, entry_key: str, enc: Encoded) -> None:
    arrays, fields = arrays_of(enc)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-"))
    try:
        written = {name: {"dtype": np.dtype(a.dtype).str, "shape": list(a.shape), "sha256": save(tmp / f"{name}.npy", a)}
                   for name, a in arrays.items()}
        meta = {"key": entry_key, "name": folder.name, "truncated": enc.truncated, "target_pad": enc.target_pad,
                "block": enc.block, "fields": fields, "arrays": written}
        (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_encoded(folder: Path, entry_key: str, vocab: int, classes: int, kind: variants.Variant) -> Encoded:
    """The arrays of ``folder``, memory-mapped, once each file is what the meta file says it is
    (each is read through once to check it, not mapped: a warm start maps only what it uses)."""
    meta = json.loads(ckpt.read_bytes(folder / "meta.json", limit=1 << 20))
    if meta.get("key") != entry_key or meta.get("name") != folder.name:
        raise Unusable("its meta names another entry")
    arrays, scanned = {}, {}
    for name, want in meta["arrays"].items():
        if not re.fullmatch(r"[a-z]+(\.[a-z]+)?", name):
            raise Unusable(f"an array named {name!r}")
        path = folder / f"{name}.npy"
        scanned[name] = found = scan(path, offsets=name.endswith(".offsets"))
        if found.dtype.str != want["dtype"] or list(found.shape) != want["shape"] or found.sha256 != want["sha256"]:
            raise Unusable(f"{name}.npy is not the array written (type, shape or checksum)")
        arrays[name] = np.load(path, mmap_mode="r", allow_pickle=False)

    def field(name: str, low: int, high: int):
        parts = meta["fields"].get(name)
        if parts is None:
            return None
        if isinstance(parts, str):
            values, offsets, ids = arrays[parts], None, scanned[parts]
        elif name not in ("src", "tgt"):  # owners as rows of ids: an older layout
            raise Unusable(f"{name} is not one array")
        else:
            values, offsets, ids, edges = arrays[parts[0]], arrays[parts[1]], scanned[parts[0]], scanned[parts[1]]
            if len(offsets) == 0 or edges.low < 0 or edges.high > len(values) or not edges.ascending:
                raise Unusable(f"the offsets of {name} do not fit its ids")
        if name != "soft" and values.size and (ids.low < low or ids.high >= high):
            raise Unusable(f"{name} holds ids outside {low}..{high - 1}")
        return values if offsets is None else Ragged(values, offsets)

    target_low = IGNORE if meta["target_pad"] == IGNORE or not kind.encoder else 0
    target_high = classes if kind.labelled else vocab
    enc = Encoded(field("src", 0, vocab), field("tgt", target_low, target_high), meta["truncated"],
                  meta["target_pad"], field("owners", 0, 2**62), field("stream", 0, vocab),
                  meta["block"], field("soft", 0, 1))
    if enc.tgt is None or len(enc.tgt) != len(enc.src) or (enc.stream is not None and enc.block <= 0):
        raise Unusable("its fields do not match")
    return enc


def discard(path: Path) -> None:
    """Remove a folder this module wrote (never a link, never a folder of another name)."""
    if path.is_symlink() or not path.is_dir():
        return
    if ENTRY.fullmatch(path.name) or (ENTRY.fullmatch(path.parent.name) and path.name.startswith("encoded-")):
        shutil.rmtree(path, ignore_errors=True)


def size_of(folder: Path) -> int:
    total = 0
    for top, _, files in os.walk(folder):  # links are not followed
        total += sum(os.lstat(os.path.join(top, f)).st_size for f in files)
    return total


def prune(folder: Path, keep: Path) -> None:
    """Keep the newest :data:`KEEP` entries, up to :func:`max_bytes` in all, and always ``keep``.
    Only folders named as keys whose mark names that key are removed."""
    entries = []
    for path in folder.iterdir():
        try:
            if ENTRY.fullmatch(path.name) and not path.is_symlink() and path.is_dir() and path != keep:
                check_mark(path)
                entries.append((path.stat().st_mtime, path))
        except (OSError, ValueError, Unusable):
            continue  # not ours, or not readable: left alone
    total = size_of(keep)
    for n, (_, path) in enumerate(sorted(entries, reverse=True), start=1):
        total += size_of(path)
        if n >= KEEP or total > max_bytes():
            shutil.rmtree(path, ignore_errors=True)
