"""A user's table files (CSV, TSV, JSON lines, JSON, Parquet, gzipped or not), each read by Hugging
Face ``datasets`` as one :class:`~taskformer.core.userlines.Part`; a file it cannot read is named by
file and line in our words (a cell too many, a quote never closed, a line that is not JSON), not in
pandas' or pyarrow's. :mod:`taskformer.core.userdata` finds the files and makes the splits.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

from taskformer.core.errors import DataError
from taskformer.core.files import first_row_too_wide
from taskformer.core.userlines import Part, numbered, quiet_datasets

TABLES = {".csv": "csv", ".tsv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}  # suffix: builder


def first_bad_utf8(path: Path) -> str | None:
    """``file:line`` of the first line that is not UTF-8, read only after a reader failed."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return f"{path}:{number}: not valid UTF-8 ({e.reason} at byte {e.start})"
    return None


def first_bad_json(path: Path) -> str | None:
    """``file:line`` of the first line of a JSON Lines file that is not a JSON object, read only after a
    reader failed (pyarrow counts its rows from 0 within a block of the file)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                return f"{path}:{number}: not JSON ({e.msg}); each line must be one JSON object"
            except RecursionError:
                return f"{path}:{number}: nested too deeply; each line must be one JSON object"
            if not isinstance(row, dict):
                return f"{path}:{number}: a JSON {type(row).__name__}, not an object; each line must be one JSON object"
    return None


def starts_with_null(path: Path) -> bool:
    """Whether a file's first row is ``null``: its first JSON value, or that of the list it begins with."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        head = f.read(1 << 16).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.removeprefix(b"[").lstrip(b" \t\r\n").startswith(b"null")


# What pandas, pyarrow and datasets say of a file without a row: a file of nothing, blank lines or a header only
NO_ROWS = ("StopIteration", "corresponds to no data", "No columns to parse")


def read_table(path: Path, ext: str, columns: str) -> Part:
    """A CSV, TSV, JSON (lines) or Parquet file (its format suffix ``ext``, a key of :data:`TABLES`)
    through ``datasets``; HF's translation layout (``{"translation": {"fr": ..., "en": ...}}``) becomes
    the columns ``fr`` and ``en``. ``columns``: the names of a headerless CSV's columns (``data.columns``)."""
    datasets = quiet_datasets()
    builder = TABLES[ext]
    options: dict[str, Any] = {}
    if builder == "csv":  # every cell as text; a TSV's quotes are characters (sentences hold them)
        options = {"keep_default_na": False, "sep": "\t" if ext == ".tsv" else ","}
        if ext == ".tsv":
            options["quoting"] = 3  # csv.QUOTE_NONE
        if columns:
            options.update(header=None, column_names=[c.strip() for c in columns.split(",")])
    width = len(options.get("column_names", ())) if builder == "csv" else 0
    if builder == "csv" and (wide := first_row_too_wide(path, options["sep"], ext != ".tsv", width)):
        raise DataError(wide)
    if builder == "json" and starts_with_null(path):  # pyarrow's JSON reader ends the process on it (SIGSEGV)
        raise DataError(f"{path}: its first row is null; {'each line' if ext == '.jsonl' else 'it'} must be a JSON "
                        f"object{'' if ext == '.jsonl' else ' or a list of objects'}")
    try:
        table = datasets.load_dataset(builder, data_files={"train": str(path)}, split="train", **options)
    except Exception as e:  # pandas, pyarrow and datasets all have their own errors
        reason = first_bad_utf8(path) if builder != "parquet" else None
        if reason is None and ext == ".jsonl":
            reason = first_bad_json(path)
        cause = str(e.__cause__ or e).strip().splitlines() or [type(e.__cause__ or e).__name__]
        if reason is None and any(words in cause[0] for words in NO_ROWS):
            reason = f"{path}: holds no rows of data{' (a header at most)' if builder == 'csv' else ''}"
        if reason is None and builder == "csv":
            reason = csv_reason(path, cause[0])
        raise DataError(reason or f"{path}: cannot read as {ext[1:]} ({cause[0]})") from None
    if "translation" in table.column_names and hasattr(table.features["translation"], "keys"):
        table = table.flatten().rename_columns({c: c.removeprefix("translation.") for c in table.flatten().column_names})
    return Part(table, path.name, "line" if ext == ".jsonl" else "row", numbered(len(table)))


def csv_reason(path: Path, said: str) -> str:
    """pandas' words for a CSV it cannot parse, in ours: the file, the line where pandas gives it, what is wrong."""
    if cells := re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", said):
        expected, line, saw = cells.groups()
        return f"{path}:{line}: {saw} cells where the first line has {expected} (a separator too many, or a cell to quote)"
    if quote := re.search(r"EOF inside string starting at row (\d+)", said):
        return (f"{path}:{int(quote.group(1)) + 1}: a quoted cell that is never closed (a \" that opens a cell runs to "
                "the end of the file)")
    return f"{path}: not a CSV file that can be read ({said.removeprefix('Error tokenizing data. C error: ')})"
