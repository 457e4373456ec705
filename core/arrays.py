"""Token ids as flat arrays: a split's rows of ids end to end in one numpy array, with the offset
where each row starts (the layout of fairseq's indexed datasets and nanoGPT's ``train.bin``).

A Python list of ids costs about 36 bytes a token; the same ids here cost 2 (``uint16``, wherever
the vocabulary has at most 65,536 entries) or 4 (``int32``). The arrays may be memory-mapped files:
reading a row reads its bytes, never the whole split, and nothing becomes a Python object until a
batch is padded into a tensor (:func:`taskformer.core.data.collate`).
"""
from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np


def id_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` where every id of a vocabulary of ``vocab_size`` fits, ``int32`` otherwise."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


def narrowest(values: np.ndarray, vocab_size: int) -> np.ndarray:
    """``values`` in :func:`id_dtype` when none is negative (a target of ``IGNORE`` is), else int32."""
    dtype = id_dtype(vocab_size) if not values.size or values.min() >= 0 else np.dtype(np.int32)
    return values.astype(dtype, copy=False)


class Ragged(Sequence):
    """Rows of different lengths: row ``i`` is ``flat[offsets[i]:offsets[i + 1]]``, a numpy view.

    Rows compare equal to lists of the same ids, so a split can be checked against what a list
    encoding gave. ``offsets`` need not start at 0: a language model's blocks are windows of one
    token stream, shifted each epoch without a copy (see :meth:`Encoded.for_epoch`).
    """

    def __init__(self, flat: np.ndarray, offsets: np.ndarray):
        self.flat, self.offsets = flat, offsets

    @classmethod
    def of(cls, rows: Iterable[Sequence[int]], dtype: Any = np.int32) -> Ragged:
        """From id lists (a plugin's, a test's, or one chunk of an encoding)."""
        rows = list(rows)
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        flat = np.fromiter(chain.from_iterable(rows), dtype=dtype, count=int(lengths.sum()))  # C loops, not Python's
        return cls(flat, starts(lengths))

    @classmethod
    def concat(cls, parts: Sequence[Ragged]) -> Ragged:
        """The rows of ``parts`` one after the other, in one new array (the dtype that holds them all)."""
        if len(parts) == 1:
            return parts[0]
        lengths = np.concatenate([p.lengths() for p in parts]) if parts else np.zeros(0, np.int64)
        flat = np.concatenate([p.values() for p in parts]) if parts else np.zeros(0, np.int32)
        return cls(flat, starts(lengths))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            first, stop, step = i.indices(len(self))
            if step != 1:
                raise ValueError("Ragged rows slice with step 1 only")
            return Ragged(self.flat, self.offsets[first : max(stop, first) + 1])
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.flat[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield self.flat[self.offsets[i] : self.offsets[i + 1]]

    def __eq__(self, other) -> bool:
        if isinstance(other, Ragged):
            return bool(np.array_equal(self.lengths(), other.lengths()) and np.array_equal(self.values(),
                                                                                          other.values()))
        if isinstance(other, (list, tuple)):
            return self.tolist() == [list(row) for row in other]
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def values(self) -> np.ndarray:
        """Every row's ids end to end (a view: the rows are contiguous)."""
        return self.flat[self.offsets[0] : self.offsets[-1]] if len(self.offsets) else self.flat[:0]

    def tolist(self) -> list[list[int]]:
        return [row.tolist() for row in self]

    def __repr__(self) -> str:
        return f"Ragged({len(self)} rows, {self.flat.dtype})"


def starts(lengths: np.ndarray) -> np.ndarray:
    """Offsets of rows of ``lengths``: 0, then their running sum."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def frame(rows: Ragged, room: int, head: Sequence[int] = (), tail: Sequence[int] = (),
          keep_end: bool = False) -> tuple[Ragged, int]:
    """Each row cut to ``room`` ids (its start, or its end where ``keep_end``) between ``head`` and
    ``tail`` (``[BOS] + ids[:room] + [EOS]``, say), in one pass over the arrays; returns the rows and
    how many were cut."""
    lengths = rows.lengths()
    kept = np.minimum(lengths, room)
    flat = rows.values()
    within = np.arange(len(flat), dtype=np.int64) - np.repeat(rows.offsets[:-1] - rows.offsets[0], lengths)
    keep = within >= np.repeat(lengths - kept, lengths) if keep_end else within < np.repeat(kept, lengths)
    body = flat[keep]
    size = kept + len(head) + len(tail)
    offsets = starts(size)
    out = np.empty(int(offsets[-1]), dtype=np.result_type(flat.dtype, np.min_scalar_type(max([*head, *tail, 0]))))
    into = np.arange(len(body), dtype=np.int64) - np.repeat(starts(kept)[:-1] - offsets[:-1] - len(head), kept)
    out[into] = body
    for k, token in enumerate(head):
        out[offsets[:-1] + k] = token
    for k, token in enumerate(tail):
        out[offsets[:-1] + len(head) + kept + k] = token
    return Ragged(out, offsets), int((lengths > room).sum())


class Spilled:
    """One array made of parts appended one at a time, each written to a temporary file as it comes,
    and the whole then memory-mapped from that file (:meth:`array`), never read back into memory: a
    list of parts joined by ``np.concatenate`` holds every part beside the whole (twice a language
    model's token stream), and a copy read back costs the whole array's bytes of the heap."""

    def __init__(self, dtype: Any):
        self.dtype, self.size = np.dtype(dtype), 0
        self.file = tempfile.TemporaryFile()  # unlinked: the mapping keeps it until the array is freed

    def append(self, part: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(part, dtype=self.dtype).data.cast("B"))
        self.size += len(part)

    def array(self) -> np.ndarray:
        """The parts end to end, mapped read-only from the file (its pages are read as they are used).
        The array's ``spilled`` attribute is the file, so a copy of it can be made by reading the
        file instead of the mapping (see :func:`taskformer.app.datacache.save`)."""
        self.file.flush()
        if not self.size:  # a file of no bytes cannot be mapped
            self.file.close()
            return np.zeros(0, self.dtype)
        out = np.memmap(self.file, self.dtype, mode="r", shape=(self.size,))
        out.spilled = self.file  # type: ignore[attr-defined]
        return out
