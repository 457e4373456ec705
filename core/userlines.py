"""The formats of a user's data read line by line here, not by ``datasets``: line-aligned files
(``train.fr`` + ``train.en``), CoNLL files and plain text. A bad line is named by its number, and
the rows stream into Arrow record batches (:class:`Columns`), about a byte a character, instead of
Python strings and lists (about 50 bytes more each): nothing holds a whole file as Python values.

:class:`Part` (the rows of one file that belong to a split) and the helpers that read a
``datasets.Dataset`` a batch at a time live here too; :mod:`taskformer.core.userdata` puts them together.
"""
from __future__ import annotations

import gzip
import os
import random
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any

import numpy as np

from taskformer.core.errors import DataError
from taskformer.core.files import each_line, read_lines
from taskformer.core.progress import stage

BATCH = 10_000  # rows of an Arrow record batch, and of a batch read back from a table
PIECE = 1 << 20  # characters at most in one row of running text (a book without blank lines is cut at lines)


@dataclass
class Part:
    """The rows of one file (or one hub split) that belong to a split, as a ``datasets.Dataset``;
    ``origin`` holds each row's place in its file, so a bad row is named ``file:line`` or ``file row N``."""

    table: Any  # datasets.Dataset
    file: str
    unit: str  # "line": origin is a line number; "row": a data row number
    origin: np.ndarray

    def where(self, i: int) -> str:
        return f"{self.file}:{self.origin[i]}" if self.unit == "line" else f"{self.file} row {self.origin[i]}"

    def take(self, indices: Iterable[int] | np.ndarray) -> Part:
        chosen = np.asarray(indices if isinstance(indices, np.ndarray) else list(indices), dtype=np.int64)
        return Part(self.table.select(chosen), self.file, self.unit, self.origin[chosen])

    def __len__(self) -> int:
        return len(self.origin)


def numbered(n: int) -> np.ndarray:
    """Places 1..n: the rows of a table, or the lines of a file of one row a line."""
    return np.arange(1, n + 1, dtype=np.int64)


def quiet_datasets():
    """The ``datasets`` module with its progress bars and logging off: the console shows our stages, and
    a file it cannot read is our one ``Error:`` line, not its own logged error too."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    return datasets


def batches(table, size: int = BATCH) -> Iterator[dict[str, list]]:
    """A table's rows in column batches, read from the memory map a batch at a time."""
    for start in range(0, len(table), size):
        yield table[start : start + size]


class Columns:
    """Rows of text columns gathered into Arrow record batches of :data:`BATCH` rows, each written to
    a temporary Arrow file as it is made, then one ``datasets.Dataset`` memory-mapped from that file
    (:meth:`dataset`): only the batch being filled is Python strings, and the rest is the kernel's
    page cache, not the heap (batches kept in memory cost about twice their bytes in a fragmented
    heap). ``lists``: columns whose values are lists of texts (a pair of texts) instead of a text."""

    def __init__(self, names: list[str], lists: tuple[str, ...] = ()):
        import pyarrow as pa

        self.names = names
        self.schema = pa.schema([(n, pa.list_(pa.string()) if n in lists else pa.string()) for n in names])
        self.rows: list[tuple[str, ...]] = []
        self.count = 0
        handle, self.path = tempfile.mkstemp(prefix="taskformer-", suffix=".arrow")
        os.close(handle)
        self.remove = weakref.finalize(self, Path(self.path).unlink, missing_ok=True)  # also when reading fails
        self.writer = pa.ipc.new_stream(self.path, self.schema)

    def add(self, *values: Any) -> None:
        self.rows.append(values)
        self.count += 1
        if len(self.rows) >= BATCH:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        if self.rows:
            columns = [pa.array(c, f.type) for c, f in zip(zip(*self.rows), self.schema)]
            self.writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=self.schema))
            self.rows = []

    def dataset(self) -> Any:
        """The rows as one ``datasets.Dataset``, mapped from the file, which is unlinked at once (the
        mapping keeps it until the table is freed). Its fingerprint is drawn at random: ``datasets``
        would otherwise hash the whole table to make one (a serialized copy of it, twice the
        table's memory at once, for a fingerprint that names a cache this table never writes)."""
        import pyarrow as pa
        from datasets.fingerprint import generate_random_fingerprint
        from datasets.table import InMemoryTable

        self.flush()
        self.writer.close()
        try:
            table = pa.ipc.open_stream(pa.memory_map(self.path)).read_all()
        finally:
            self.remove()
        return quiet_datasets().Dataset(InMemoryTable(table), fingerprint=generate_random_fingerprint())


def read_aligned(paths: dict[str, Path]) -> Part:
    """Line-aligned files of one split, one per language (``train.fr``, ``train.en``): columns named by
    language, read side by side a line at a time."""
    names = "+".join(p.name for p in paths.values())
    rows = Columns(list(paths))
    with stage(f"reading {names}", None, every=20_000) as advance:
        for values in zip_longest(*(each_line(p, shown=False) for p in paths.values())):
            if None in values:
                counts = ", ".join(f"{p.name} {sum(1 for _ in each_line(p, shown=False)):,}" for p in paths.values())
                raise DataError(f"{next(iter(paths.values())).parent}: line-aligned files must have as many lines "
                                f"({counts})")
            rows.add(*values)
            advance()
    if not rows.count:
        raise DataError(f"{next(iter(paths.values()))}: holds only blank lines, no text")
    return Part(rows.dataset(), names, "line", numbered(rows.count))


def read_conll(path: Path) -> tuple[Part, list[str]]:
    """Sentences of a CoNLL file (a word per line, its tag in the last column, a blank line between
    sentences, ``-DOCSTART-`` lines skipped) as the columns ``tokens`` and ``tags`` (space-separated);
    also the places of lines without a tag, whose sentences are left out."""
    words: list[str] = []
    tags: list[str] = []
    rows = Columns(["tokens", "tags"])
    origin: list[int] = []
    untagged: list[str] = []
    start, broken = 0, False

    def end() -> None:
        if words and not broken:
            rows.add(" ".join(words), " ".join(tags))
            origin.append(start)
        words.clear()
        tags.clear()

    for number, line in enumerate([*read_lines(path), ""], 1):
        cells = line.split()
        if not cells or cells[0] == "-DOCSTART-":
            end()
            broken = False
            continue
        if not words:
            start = number
        if len(cells) < 2:
            untagged.append(f"{path.name}:{number}")
            broken = True
        words.append(cells[0])
        tags.append(cells[-1])
    return Part(rows.dataset(), path.name, "line", np.asarray(origin, dtype=np.int64)), untagged


def paragraphs(lines: Iterable[str]) -> Iterator[str]:
    """Running text as paragraphs, each with its line breaks and the blank lines after it (so joined
    they give the text back; blank lines before the first words belong to the first paragraph, never
    a row of their own, which would be left out as empty), and none over :data:`PIECE` characters: the core joins them into one
    stream again, and the outputs files hold readable pieces instead of one huge row."""
    piece: list[str] = []
    size, blank, words = 0, False, False  # words: the piece has more than blank lines (which start no piece)
    for line in lines:
        if words and ((line and blank) or size > PIECE):
            yield "".join(piece)
            piece, size, words = [], 0, False
        piece.append(line + "\n")
        size += len(line) + 1
        blank = not line
        words = words or bool(line.strip())
    if piece:
        yield "".join(piece)


def text_part(paths: list[Path], name: str, lines: Iterable[str] | None = None) -> Part:
    """Running text (``paths`` one after the other, or ``lines`` read from them) as rows of paragraphs."""
    rows = Columns(["text"])
    for piece in paragraphs(lines if lines is not None else (line for p in paths for line in each_line(p))):
        rows.add(piece)
    return Part(rows.dataset(), name, "row", numbered(rows.count))


def text_size(path: Path) -> int:
    """The bytes of text a file holds: its size, or for a ``.gz`` file what it unpacks to."""
    if path.suffix != ".gz":
        return path.stat().st_size
    with gzip.open(path, "rb") as f:
        return sum(len(block) for block in iter(lambda: f.read(1 << 20), b""))


def read_text(paths: list[Path], seed: int, val: float, test: float, many: int) -> tuple[dict[str, list[Part]], str]:
    """Running text for a language model, in its order: one or a few files are read one after the
    other and the last ``val + test`` of the text's bytes held out (nanoGPT's rule; cut at line ends),
    val before test; with ``many`` files or more, whole files are held out by a seeded shuffle. The
    text streams through: its size comes from the files' sizes, never from holding it."""
    if len(paths) >= many:
        order = list(paths)
        random.Random(seed).shuffle(order)
        n_val, n_test = (max(1, round(f * len(order))) for f in (val, test))
        chosen = {"val": order[:n_val], "test": order[n_val:n_val + n_test], "train": order[n_val + n_test:]}
        return ({s: [text_part([p], p.name) for p in sorted(chosen[s])] for s in ("train", "val", "test")},
                f"whole files held out by a seeded shuffle (data.split_seed): {n_val} val, {n_test} test")
    total = sum(text_size(p) for p in paths)
    cuts = [total * (1 - (val + test)), total * (1 - test)]
    lines = (line for p in paths for line in each_line(p))
    seen = 0

    def upto(cut: float) -> Iterator[str]:  # the lines until the byte count passes ``cut``, at a line end
        nonlocal seen
        while seen < cut:
            line = next(lines, None)
            if line is None:
                return
            seen += len(line.encode("utf-8")) + 1
            yield line

    name = "+".join(p.name for p in paths)
    splits = {"train": [text_part(paths, name, upto(cuts[0]))], "val": [text_part(paths, name, upto(cuts[1]))],
              "test": [text_part(paths, name, upto(float("inf")))]}
    return splits, f"the text in order: the last {val + test:.0%} of its bytes held out, val then test"
