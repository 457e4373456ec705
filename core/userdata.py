"""A user's own data: a file, a folder or a hub data set, read as train/val/test splits of named columns.

The generic tasks (``classify``, ``translate``, ``lm``, ``tag``) read their data here; nothing here
knows a task or the command line. Tables (CSV, TSV, JSON lines, JSON, Parquet, gzipped or not:
:mod:`taskformer.core.usertables`) and hub data sets are read by Hugging Face ``datasets``, which
keeps them as memory-mapped Arrow files in its own cache (``HF_DATASETS_CACHE``, by default under
``~/.cache/huggingface``) until a task asks for rows (:meth:`Source.rows`, the one place rows become
Python values). Line-aligned files (``train.fr`` + ``train.en``), plain text (``.txt``) and CoNLL
files are read line by line (:mod:`taskformer.core.userlines`), so a bad line is named by its number.

Splits come from file names (``train``, ``val``/``valid``/``validation``/``dev``, ``test``, or a
name that starts with one of them and a separator: ``test_2016_flickr.de``), from a ``split``
column, or else from a seeded shuffle of the rows (:data:`SPLIT_RULE`); running text keeps its order
(:func:`read_text`). docs/data.md is the user's reference.
"""
from __future__ import annotations

import random
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from taskformer.core.errors import DataError
from taskformer.core.options import option
from taskformer.core.userlines import BATCH, Part, batches, numbered, quiet_datasets, read_aligned, read_conll, text_part
from taskformer.core.userlines import read_text as read_running
from taskformer.core.usertables import TABLES, read_table

SPLITS = ("train", "val", "test")
SPLIT_NAMES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "dev": "val", "test": "test"}
SPLIT_RULE = "a seeded shuffle of train's rows (data.split_seed; shares data.val_fraction, data.test_fraction)"
CONLL = (".conll", ".conll2003", ".bio", ".iob", ".iob2", ".ner")
LANGUAGE = re.compile(r"[a-z]{2,3}([-_][A-Za-z]{2,4})?")  # a language code as a file suffix or column: de, pt-BR
NOT_LANGUAGE = {"md", "py", "sh", "yml", "log", "pdf", "zip", "tar", "rst", "xml", "ini", "cfg", "htm", "doc",
                "bak", "tmp", "out", "err", "png", "jpg", "bin", "pkl", "npy", "npz", "lock", "json", "jsonl"}
MANY_FILES = 10  # plain-text files from which lm holds out whole files instead of the end of the text
SHOWN = 3  # bad rows named per reason; the rest are counted


@dataclass
class ReadOptions:
    """The ``data`` options every generic task shares: how the splits are made and headerless columns named."""

    split_seed: int = option(0, "Seed of the shuffle that makes missing splits; independent of train.seed, so "
                                "the test rows stay the same across training seeds.", at_least=0)
    val_fraction: float = option(0.05, "Share of train held out (seeded shuffle) as val when no val file or "
                                       "split column gives one.", above=0.0, below=1.0)
    test_fraction: float = option(0.05, "Share of train held out (seeded shuffle) as test when no test file or "
                                        "split column gives one.", above=0.0, below=1.0)
    columns: str = option("", "Column names of a headerless CSV/TSV, comma-separated (label,title,description); "
                              "empty: the first row names them.")


@dataclass
class Source:
    """A user's data as splits of parts with named columns, and how the splits were made."""

    location: str
    splits: dict[str, list[Part]]
    columns: list[str]
    how: str
    notes: dict[str, str] = field(default_factory=dict)
    running: bool = False  # plain text in its order, not rows of a table (a language model's stream)

    def feature(self, column: str) -> Any:
        """The ``datasets`` feature of ``column`` (a ``ClassLabel`` names integer labels)."""
        return self.splits["train"][0].table.features.get(column)

    def pick(self, role: str, given: str, common: tuple[str, ...], several: bool = False) -> list[str]:
        """The column(s) of ``role``: ``given`` (``--set data.ROLE=a,b``) or the one of ``common`` present.

        An unknown name, no common name or more than one of them is refused with the columns found."""
        found = ", ".join(self.columns)
        if given:
            names = [n.strip() for n in given.split(",") if n.strip()]
            if unknown := [n for n in names if n not in self.columns]:
                raise DataError(f"{self.location}: no column {unknown[0]!r} (data.{role}); columns found: {found}")
            if len(names) > 1 and not several:
                raise DataError(f"data.{role}: one column, got {given!r}; columns found: {found}")
            return names
        present = [n for n in common if n in self.columns]
        if len(present) == 1:
            return present
        headerless = " (a file without a header row: name its columns with --set data.columns=a,b,c)"
        if not present:
            raise DataError(f"{self.location}: no {role} column (looked for {', '.join(common)}); columns found: "
                            f"{found}; choose one with --set data.{role}=NAME" + headerless * self.guessable())
        raise DataError(f"{self.location}: ambiguous {role} column ({' and '.join(present)} both present); "
                        f"columns found: {found}; choose with --set data.{role}=NAME")

    def guessable(self) -> bool:
        """Whether a header could have been a data row (a CSV's first row read as names)."""
        return any(not re.fullmatch(r"[A-Za-z_][\w .-]{0,40}", c) for c in self.columns)

    def clean(self, split: str, columns: list[str]) -> list[Part]:
        """The split's parts without the rows whose value in one of ``columns`` is missing (null) or
        empty; those are counted in ``notes`` by file and line. Found with Arrow's compute functions:
        no row becomes a Python value here."""
        bad: dict[str, list[str]] = {}
        parts = []
        for part in self.splits[split]:
            dropped = np.zeros(len(part), dtype=bool)
            for column in columns:
                for reason, mask in zip(("missing", "empty"), blanks(part.table, column)):
                    if (new := mask & ~dropped).any():
                        bad.setdefault(f"{reason} {column}", []).extend(part.where(int(i)) for i in np.flatnonzero(new))
                    dropped |= mask
            parts.append(part.take(np.flatnonzero(~dropped)) if dropped.any() else part)
        for reason, places in bad.items():
            self.skip(split, reason, places)
        return parts

    def each_batch(self, split: str, columns: list[str]) -> Iterator[tuple[list[tuple], Callable[[int], str]]]:
        """The split's values of ``columns`` as batches of Python rows, without the rows :meth:`clean`
        leaves out, each with ``where(i)``: the place (``file:line``) of its row ``i``. Only a batch at
        a time is Python values: a large train split streams through."""
        for part in self.clean(split, columns):
            table = part.table.select_columns(columns)
            for start in range(0, len(part), BATCH):
                batch = table[start : start + BATCH]

                def where(i: int, part: Part = part, start: int = start) -> str:
                    return part.where(start + i)
                yield list(zip(*(batch[c] for c in columns))), where

    def rows(self, split: str, columns: list[str]) -> tuple[list[tuple], list[str]]:
        """:meth:`each_batch` as one list of rows and their places: for the val and test rows, which
        are decoded and scored as text."""
        rows: list[tuple] = []
        where: list[str] = []
        for batch, place in self.each_batch(split, columns):
            rows.extend(batch)
            where.extend(place(i) for i in range(len(batch)))
        return rows, where

    def dataset(self, split: str, columns: list[str], names: list[str]) -> Any:
        """The split's ``columns`` renamed ``names``, as one ``datasets.Dataset`` without the rows
        :meth:`clean` leaves out: train's rows handed to the core lazily (read a chunk at a time)."""
        datasets = quiet_datasets()
        tables = [p.table.select_columns(columns) for p in self.clean(split, columns)]
        table = tables[0] if len(tables) == 1 else datasets.concatenate_datasets(tables)
        temporary = {c: f"__{i}" for i, c in enumerate(columns)}  # two steps: a column may be renamed to another's name
        return table.rename_columns(temporary).rename_columns(dict(zip(temporary.values(), names)))

    def skip(self, split: str, reason: str, places: list[str], count: int | None = None) -> None:
        """Count rows left out of ``split`` for ``reason`` in the notes, naming the first few
        (``count``: all of them, where ``places`` holds only the first few, as a :class:`Tally`'s)."""
        count = len(places) if count is None else count
        shown = ", ".join(places[:SHOWN]) + (f" and {count - SHOWN:,} more" if count > SHOWN else "")
        self.notes[f"{split} rows left out ({reason})"] = f"{count:,}: {shown}"

    def sizes(self) -> str:
        return ", ".join(f"{s} {sum(len(p) for p in self.splits[s]):,}" for s in SPLITS)


class Tally:
    """Rows left out for one reason while a split streams by: their count and the first few places
    (made only for those: a place is a string, and a bad file may have millions of bad rows)."""

    def __init__(self, reason: str):
        self.reason, self.count = reason, 0
        self.places: list[str] = []

    def add(self, where: Callable[[int], str], i: int, detail: str = "") -> None:
        """Row ``i`` of a batch whose places ``where`` gives (:meth:`Source.each_batch`), with ``detail``."""
        self.count += 1
        if len(self.places) < SHOWN:
            self.places.append(f"{where(i)} ({detail})" if detail else where(i))

    def tell(self, source: Source, split: str) -> None:
        """Into ``source``'s notes, where any row was left out."""
        if self.count:
            source.skip(split, self.reason, self.places, self.count)


def blanks(table, column: str) -> tuple[np.ndarray, np.ndarray]:
    """Which rows of ``column`` are missing (null) and which empty (blank text, an empty list)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = table.with_format("arrow")[column]
    missing = np.asarray(values.is_null(), dtype=bool)
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        def blank(chunk):  # trimmed a record batch at a time: a trimmed copy of a whole column is its size again
            return pc.equal(pc.utf8_trim_whitespace(chunk), "")
    elif pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
        def blank(chunk):
            return pc.equal(pc.list_value_length(chunk), 0)
    else:
        return missing, np.zeros_like(missing)
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    empty = np.concatenate([np.zeros(0, dtype=bool)] + [np.asarray(blank(c).fill_null(False), dtype=bool)
                                                        for c in chunks])
    return missing, empty & ~missing


def suffixes(path: Path) -> tuple[str, str]:
    """(name without compression or format suffix, format suffix): ``train.de.gz`` -> (``train``, ``.de``)."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    stem, dot, ext = name.rpartition(".")
    return (stem, "." + ext.lower()) if dot else (name, "")


def split_of(stem: str) -> str | None:
    """The split a file name gives: ``valid``, ``dev-2020``, ``test_2016_flickr``; None for any other name."""
    head = re.split(r"[._-]", stem.lower(), maxsplit=1)[0]
    return SPLIT_NAMES.get(head)


def kind_of(path: Path, lm: bool) -> str | None:
    """How a file is read: ``table``, ``text``, ``conll``, ``lines`` (a language suffix), or None (not data)."""
    stem, ext = suffixes(path)
    if ext in TABLES:
        return "table"
    if ext in CONLL:
        return "conll"
    if ext == ".txt" or (lm and ext == "" and path.name != "README"):
        return "text"
    if stem and LANGUAGE.fullmatch(ext[1:]) and ext[1:] not in NOT_LANGUAGE:
        return "lines"
    return None


def read_text(paths: list[Path], opts: ReadOptions) -> tuple[dict[str, list[Part]], str]:
    """Running text for a language model, in its order (see :func:`taskformer.core.userlines.read_text`)."""
    return read_running(paths, opts.split_seed, opts.val_fraction, opts.test_fraction, MANY_FILES)


def read_hub(name: str) -> dict[str, list[Part]]:
    """``hub:NAME[:CONFIG]`` through ``datasets.load_dataset``: its train/validation/test splits."""
    datasets = quiet_datasets()
    repo, _, config = name.partition(":")
    try:
        loaded = datasets.load_dataset(repo, config or None)
    except Exception as e:  # offline, unknown name, a config needed: the same to the user
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"cannot load {repo!r} from the Hugging Face hub ({first})") from None
    splits: dict[str, list[Part]] = {}
    for hub_split, table in loaded.items():
        if (ours := SPLIT_NAMES.get(hub_split)) and ours not in splits:
            if "translation" in table.column_names:
                table = table.flatten()
                table = table.rename_columns({c: c.removeprefix("translation.") for c in table.column_names})
            splits[ours] = [Part(table, f"hub {repo} {hub_split}", "row", numbered(len(table)))]
    return splits


def files(folder: Path, lm: bool) -> list[Path]:
    """The data files of a folder (recursively), in name order; other files (a README) are not data."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".") and kind_of(p, lm))


def read(location: str, opts: ReadOptions, lm: bool = False) -> Source:
    """The data at ``location`` (a file, a folder, or ``hub:NAME[:CONFIG]``) as splits of parts.

    ``lm``: plain text is running text for a language model, kept in order (:func:`read_text`).
    Missing splits are carved from train (:func:`carve`); an empty split is refused."""
    notes: dict[str, str] = {}
    if location.startswith("hub:"):
        splits, how = read_hub(location[4:]), "the hub's splits"
    else:
        path = Path(location)
        if not path.exists():
            raise DataError(f"{path}: no such file or folder")
        found = [path] if path.is_file() else files(path, lm)
        if not found:
            raise DataError(f"{path}: no data files (CSV, TSV, JSONL, JSON, Parquet, .txt, CoNLL, or "
                            "line-aligned files named by language such as train.fr + train.en)")
        if unknown := next((p for p in found if not kind_of(p, lm)), None):
            raise DataError(f"{unknown}: not a data format taskformer reads (.csv, .tsv, .jsonl, .json, .parquet, "
                            ".txt, .conll, or a language suffix such as .fr; each may be .gz)")
        if lm and {kind_of(p, lm) for p in found} == {"text"}:
            named = {p: split_of(suffixes(p)[0]) for p in found}
            if not all(named.values()):
                splits, how = read_text(found, opts)
                return finish(Source(location, splits, ["text"], how, notes, running=True))
            splits = {s: [text_part([f], f.name) for f in found if named[f] == s] for s in SPLITS}
            return finish(Source(location, splits, ["text"], "file names", notes, running=True))
        else:
            splits, how = read_files(found, path, opts, notes)
    return finish(Source(location, splits, columns_of(splits), how, notes), opts)


def read_files(found: list[Path], root: Path, opts: ReadOptions, notes: dict[str, str]) -> tuple[dict, str]:
    """Each file read by its kind and put in the split its name gives; all in train where none gives one."""
    named = {p: split_of(suffixes(p)[0]) for p in found}
    if any(named.values()) and (stray := next((p for p, s in named.items() if s is None), None)):
        raise DataError(f"{stray}: not a train, val or test file name, beside files that are (rename it, or "
                        "move it out of the data folder)")
    splits: dict[str, list[Part]] = {}
    aligned: dict[tuple[str | None, str], dict[str, Path]] = {}
    for p in found:
        kind, split = kind_of(p, False), named[p] or "train"
        stem, ext = suffixes(p)
        if kind == "lines":
            aligned.setdefault((named[p], stem), {})[ext[1:]] = p
        elif kind == "conll":
            part, untagged = read_conll(p)
            splits.setdefault(split, []).append(part)
            if untagged:
                places = ", ".join(untagged[:SHOWN]) + (f" and {len(untagged) - SHOWN} more" if len(untagged) > SHOWN else "")
                notes[f"{split} sentences left out (a line with no tag)"] = f"{len(untagged):,}: {places}"
        elif kind == "text":
            raise DataError(f"{p}: plain text is read by the lm task only; give a CSV, TSV, JSONL or Parquet file "
                            "with named columns")
        else:
            splits.setdefault(split, []).append(read_table(p, ext, opts.columns))
    for (named_split, stem), by_lang in aligned.items():
        if len(by_lang) < 2:
            raise DataError(f"{next(iter(by_lang.values()))}: a line-aligned file needs its partner "
                            f"({stem}.xx in another language)")
        splits.setdefault(named_split or "train", []).append(read_aligned(by_lang))
    return splits, "file names" if any(named.values()) else "one file" if len(found) == 1 else "files"


def columns_of(splits: dict[str, list[Part]]) -> list[str]:
    """The columns every part has (a part without one of them is refused, naming it)."""
    parts = [p for ps in splits.values() for p in ps]
    if not parts:
        return []
    columns = parts[0].table.column_names
    for p in parts[1:]:
        if set(p.table.column_names) != set(columns):
            raise DataError(f"{p.file}: columns {', '.join(p.table.column_names)} differ from {parts[0].file}'s "
                            f"({', '.join(columns)}): every file must have the same columns")
    return list(columns)


def finish(source: Source, opts: ReadOptions | None = None) -> Source:
    """Splits from a ``split`` column where there is one, the missing ones carved from train; no split empty."""
    if opts is not None and "split" in source.columns:
        by_split(source)
    if opts is not None and "train" in source.splits and not all(s in source.splits for s in SPLITS):
        carve(source, opts)
    if empty := [s for s in SPLITS if not sum(len(p) for p in source.splits.get(s, []))]:
        raise DataError(f"{source.location}: the {' and '.join(empty)} split would be empty ({source.how}; "
                        f"rows: {', '.join(f'{s} {sum(len(p) for p in source.splits.get(s, [])):,}' for s in SPLITS)}); "
                        "give more rows or a file for it")
    source.notes = {"data": source.location, "splits": f"{source.sizes()} ({source.how})", **source.notes}
    return source


def by_split(source: Source) -> None:
    """Rows to the split their ``split`` column names (train, val/valid/validation/dev, test)."""
    parts = [p for ps in source.splits.values() for p in ps]
    splits: dict[str, list[Part]] = {}
    for part in parts:
        chosen: dict[str, list[int]] = {}
        for i, value in enumerate(part.table["split"]):
            ours = SPLIT_NAMES.get(str(value).strip().lower())
            if ours is None:
                raise DataError(f"{part.where(i)}: split {value!r} is not train, val (valid, validation, dev) or test")
            chosen.setdefault(ours, []).append(i)
        for split, indices in chosen.items():
            splits.setdefault(split, []).append(part.take(indices))
    source.splits, source.how = splits, "the split column"


def carve(source: Source, opts: ReadOptions) -> None:
    """Val and test rows drawn from train by a shuffle seeded with ``data.split_seed`` (never by position:
    sorted data would give a val set of one kind)."""
    train = source.splits["train"]
    order = list(range(sum(len(part) for part in train)))  # the same shuffle as of a list of (part, row)
    random.Random(opts.split_seed).shuffle(order)
    places = np.asarray(order, dtype=np.int64)
    del order
    wanted = {s: f for s, f in (("val", opts.val_fraction), ("test", opts.test_fraction)) if s not in source.splits}
    taken: dict[str, np.ndarray] = {}
    total = len(places)
    for split, fraction in wanted.items():
        n = min(max(1, round(fraction * total)), max(len(places) - 1, 0))
        taken[split], places = places[:n], places[n:]
    taken["train"] = places
    edges = np.cumsum([0] + [len(part) for part in train])
    for split, chosen in taken.items():
        chosen = np.sort(chosen)
        source.splits[split] = [part.take(chosen[(chosen >= lo) & (chosen < hi)] - lo)
                                for part, lo, hi in zip(train, edges[:-1], edges[1:])]
    source.how += f"; {' and '.join(wanted)} from {SPLIT_RULE}"


def location(data_dir: Path | str | None, task: str) -> str:
    """The ``--data`` a generic task was given, refused where there is none."""
    if data_dir is None:
        raise DataError(f"{task} reads your data: give --data PATH (a file, a folder, or hub:NAME[:CONFIG]; "
                        "docs/data.md)")
    return str(data_dir)


def tell(source: Source) -> None:
    """Say on stderr, before any training, which rows were left out (the report's data notes keep them)."""
    for key, value in source.notes.items():
        if "left out" in key:
            sys.stderr.write(f"warning: {key}: {value}\n")


def is_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()


SHAPED = (list, dict)  # what a label never is


class LabelNames:
    """The names of a label column's values: text labels as they are, a hub ``ClassLabel``'s names,
    numbers as their digits or as ``data.label_names`` (the i-th name for the i-th smallest number in
    train). ``names`` lists them (text sorted, numbers in their order); a val or test row whose label
    train never has is left out and counted (the model cannot learn it)."""

    def __init__(self, source: Source, column: str, given: str):
        self.source, self.column = source, column
        values: set = set()
        for part in source.splits["train"]:
            for batch in batches(part.table.select_columns([column])):
                values.update(v for v in batch[column] if v is not None and str(v).strip() and not isinstance(v, SHAPED))
        classes = getattr(source.feature(column), "names", None)
        numeric = bool(values) and all(is_number(v) for v in values)
        order = sorted(values, key=(lambda v: v) if numeric else str)
        chosen = [n.strip() for n in given.split(",")] if given else []
        if chosen and not numeric:
            raise DataError(f"data.label_names names numeric labels; column {column!r} holds text labels "
                            f"({', '.join(map(str, order[:5]))}...)")
        if chosen and len(chosen) != len(order):
            raise DataError(f"data.label_names gives {len(chosen)} names but train has {len(order)} label values in "
                            f"column {column!r} ({', '.join(str(int(v)) for v in order[:12])})")
        if classes:
            self.of = {v: classes[int(v)] for v in order}
        elif chosen:
            self.of = dict(zip(order, chosen))
        else:
            self.of = {v: str(int(v)) if numeric else str(v) for v in order}
        self.names = list(self.of.values())

    def keep(self, split: str, batches: Iterable[tuple[list[tuple], Callable[[int], str]]]) -> Iterator[tuple]:
        """``(input, label name)`` rows of batches of ``(input, label value)`` rows and their places
        (as :meth:`Source.each_batch` gives them); those whose label train lacks are left out, and
        named in the notes once the last batch is read."""
        unseen = Tally(f"a {self.column} train never has")
        shaped = Tally(f"a {self.column} that is a list or an object, not a text or a number")
        for rows, where in batches:
            for i, (text, value) in enumerate(rows):
                if isinstance(value, SHAPED):  # a JSON column of mixed kinds: a list or an object is no label
                    shaped.add(where, i)
                elif value in self.of:
                    yield text, self.of[value]
                else:
                    unseen.add(where, i, str(value))
        unseen.tell(self.source, split)
        shaped.tell(self.source, split)
