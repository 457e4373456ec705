"""Reading a task's data files: UTF-8 text, plain or gzip, a line at a time, with bad input named by
file and line (a task's data hook reads its files with these; :mod:`taskformer.core.data` encodes
what it returns)."""
from __future__ import annotations

import csv
import gzip
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from pathlib import Path

from taskformer.core.errors import DataError
from taskformer.core.progress import stage


def find_file(data_dir: str | Path, name: str) -> Path:
    """``DIR/name`` or ``DIR/name.gz``, whichever exists; a clear error when neither or both do."""
    base = Path(data_dir) / name
    found = [path for path in (base, base.with_name(base.name + ".gz")) if path.exists()]
    if len(found) == 2:
        raise DataError(f"{base}: both {base.name} and {base.name}.gz exist; remove one so it is clear which to use")
    if not found:
        raise DataError(f"{base}: file not found (also looked for {base.name}.gz)")
    if not found[0].is_file():
        raise DataError(f"{found[0]}: not a regular file (a directory?); expected the data file itself")
    return found[0]


def read_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 text file, plain or gzip, without line endings or a leading byte-order mark.

    Lines end in LF or CRLF, or, in a file without LF, in CR alone (classic Mac OS), which would
    otherwise make the whole file one example. Undecodable bytes are reported with the file name and
    line number, and a file with no text (only blank lines) is refused, not a traceback or a model
    trained on nothing.
    """
    out = list(each_line(path))
    if not any(line.strip() for line in out):
        raise DataError(f"{path}: holds only blank lines, no text")
    return out


def each_line(path: str | Path, shown: bool = True) -> Iterator[str]:
    """The lines of a file as :func:`read_lines` reads them, one at a time (never the whole file at
    once); an empty file is refused. ``shown``: a stage of the console's (not for files read side by side)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    any_line = False
    try:
        counted = stage(f"reading {path.name}", None, every=20_000) if shown else nullcontext(lambda n=1: None)
        with opener(path, "rb") as f, counted as advance:
            head = f.read(1 << 20)
            f.seek(0)
            lines: Iterable[bytes] = f  # a line at a time: never the whole file's bytes at once
            if b"\n" not in head and b"\r" in head:  # CR alone: classic Mac line ends (such files are small)
                pieces = f.read().split(b"\r")
                lines = pieces[:-1] if pieces[-1] == b"" else pieces
            for i, line in enumerate(lines, 1):
                if i == 1:
                    line = line.removeprefix(b"\xef\xbb\xbf")  # a BOM is not part of the first line's text
                try:
                    text = line.removesuffix(b"\n").decode("utf-8").rstrip("\r")
                except UnicodeDecodeError as e:
                    raise DataError(f"{path}:{i}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
                any_line = True
                yield text
                advance()
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read ({e})") from None
    if not any_line:
        raise DataError(f"{path}: file is empty")


def read_parallel(src_path: Path, tgt_path: Path) -> list[tuple[str, str]]:
    """Line-aligned source/target files; unequal line counts are an error naming both files."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: the pair files must align")
    return list(zip(src, tgt))


def read_tsv(path: str | Path, columns: int = 2) -> list[tuple[str, ...]]:
    """Rows of ``columns`` TAB-separated texts, one per line, plain or gzip: by default
    ``source<TAB>target`` pairs; ``columns=3`` reads ``premise<TAB>hypothesis<TAB>label``, say. A
    line with another number of columns, or an empty one, is an error naming the file and line."""
    names = ("source", "target") if columns == 2 else [f"column {n}" for n in range(1, columns + 1)]
    between = "one TAB between source and target" if columns == 2 else f"{columns - 1} TABs between {columns} columns"
    rows = []
    for i, line in enumerate(read_lines(path), 1):
        cells = line.split("\t")
        if len(cells) != columns:
            raise DataError(f"{path}:{i}: expected {between}, found {len(cells) - 1}")
        if empty := next((name for name, cell in zip(names, cells) if not cell.strip()), None):
            raise DataError(f"{path}:{i}: empty {empty}")
        rows.append(tuple(cells))
    return rows


def first_row_too_wide(path: Path, sep: str, quoted: bool, names: int = 0) -> str | None:
    """``file:line`` where a table's first row of data has more cells than its header (or than the
    ``names`` given for a file without one): pandas would silently make the extra cell the rows'
    index and shift every column by one, where any later row that is too wide is refused."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8-sig", errors="replace", newline="") as f:
        reader = csv.reader(f, delimiter=sep, quoting=csv.QUOTE_MINIMAL if quoted else csv.QUOTE_NONE)
        rows = (row for row in reader if row)
        width = names or len(next(rows, []))
        first = next(rows, None)
        if first is not None and len(first) > width:
            header = "the column names given are" if names else "the first line has"
            return (f"{path}:{reader.line_num}: {len(first)} cells where {header} {width} (a separator too many, "
                    "or a cell to quote)")
    return None
