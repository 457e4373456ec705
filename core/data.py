"""Task-agnostic data plumbing: reading files, encoding text pairs, and token-based batching.

A task's data pipeline hands the core a :class:`TaskData` of raw ``(source, target)`` text pairs
and a trained tokenizer; everything after that -- ids, padding, batching -- happens here.
"""
from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from tokenizers import Encoding, Tokenizer

from taskformer.core import variants
from taskformer.core.arrays import Ragged, Spilled, frame, id_dtype, starts
from taskformer.core.errors import DataError
from taskformer.core.tokenize import BOS, EOS, PAD, UNK

if TYPE_CHECKING:
    import torch

Indices = Sequence[int] | np.ndarray  # a split's row lengths, or a batch's row numbers
Batch = np.ndarray  # the row numbers of one batch (see token_batches)
IGNORE = -100  # a target that is not scored: a tagging position with no label (BOS, padding, a word's later tokens)


@dataclass
class TaskData:
    """What a task's data hook returns.

    ``splits`` maps ``train``/``val``/``test`` to ``(source, target)`` strings, or to ``(source,
    target, fields)`` with a dict of per-example fields that the metrics and report hooks receive. The target is text for
    an encoder-decoder; for classification it is one name from ``labels``; for tagging it is one name
    from ``labels`` per whitespace-separated word of the source, separated by spaces
    (``("Anna lives in Paris", "B-PER O O B-LOC")``). A classifier of pairs (``Task(pairs=True)``)
    has a tuple of two texts as its source: ``(("A man sleeps.", "A person rests."), "entailment")``.
    A distillation's student of a classifier has, in place of a train row's label, its teacher's
    distribution over ``labels`` (a dict of label to probability: soft targets, Hinton et al., 2015).
    For a decoder-only model the source is a
    prompt, read but never scored (a loss mask), and the target the text that follows it: rows
    with a prompt end in EOS, while the rows without one are running text, joined into one stream
    (``("", whole_text)`` is a corpus; see :func:`encode_text`). ``notes`` are extra facts for the
    report's data table (e.g. how many inputs were truncated or held unknown characters).
    A split may be a list or any sized, indexable sequence of rows, or a ``datasets.Dataset`` with
    ``source`` and ``target`` columns (see :func:`rows`): the train split is encoded a chunk at a
    time, never held as Python strings.
    """

    tokenizer: Tokenizer
    splits: dict[str, Sequence]
    labels: list[str] | None = None
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class Encoded:
    """Token ids of one split: sources always; targets as id rows (sequence tasks), class ids, or one
    tag id per source position (tagging, ``IGNORE`` where nothing is scored).

    Rows are :class:`~taskformer.core.arrays.Ragged` (flat numpy arrays with offsets, possibly
    memory-mapped from the cache); lists given here are converted, so a test or a plugin may still
    write ``Encoded(src=[[5, 6, EOS]], tgt=[[BOS, 5, 6, EOS]])``."""

    src: Ragged
    tgt: Ragged | np.ndarray
    truncated: int = 0
    target_pad: int = PAD  # fills a batch's shorter target rows: IGNORE for tags, where 0 is a real tag
    owners: np.ndarray | None = None  # decoder-only evaluation: (row, count) runs of the scored targets (see encode_text)
    stream: np.ndarray | None = None  # decoder-only training: the running text its first blocks are cut from
    block: int = 0  # and their length
    soft: np.ndarray | None = None  # a classifier's target distributions, where any row has one (distillation)

    def __post_init__(self):
        if not isinstance(self.src, Ragged):
            self.src = Ragged.of(self.src)
        if not isinstance(self.tgt, (Ragged, np.ndarray)):
            rows = list(self.tgt)
            self.tgt = Ragged.of(rows) if rows and not np.isscalar(rows[0]) else np.asarray(rows, dtype=np.int64)
        if self.owners is not None:
            self.owners = np.asarray(self.owners, dtype=np.int64).reshape(-1, 2)
        if self.stream is not None:
            self.stream = np.asarray(self.stream)
        if self.soft is not None:
            self.soft = np.asarray(self.soft, dtype=np.float32)

    @property
    def sequences(self) -> bool:
        """Whether the targets are rows of ids (a sequence or a tagging) rather than one class each."""
        return isinstance(self.tgt, Ragged)

    def for_epoch(self, epoch: int, seed: int) -> Encoded:
        """The examples of training epoch ``epoch``. A language model's running text is cut at another
        offset each epoch (drawn from ``seed`` and ``epoch``, so a resumed run cuts alike): its blocks
        begin anywhere in the text, as nanoGPT's randomly placed ones, instead of at the same places
        every epoch. Every epoch has the same blocks' count and lengths; other data is as it is. The
        blocks are windows of the stream, not copies."""
        if self.stream is None:
            return self
        block, offset = self.block, random.Random(seed * 100_003 + epoch).randrange(self.block)
        n = self.stream_blocks()
        edges = offset + block * np.arange(n + 1, dtype=np.int64)
        src, tgt = Ragged(self.stream, edges), Ragged(self.stream, edges + 1)
        if len(self.src) > n:  # rows with a prompt follow the stream's blocks
            src, tgt = Ragged.concat([src, self.src[n:]]), Ragged.concat([tgt, cast(Ragged, self.tgt)[n:]])
        return replace(self, src=src, tgt=tgt)

    def stream_blocks(self) -> int:
        """Whole blocks of the stream at any offset below a block."""
        if self.stream is None:
            return 0
        return (len(self.stream) - 1) // self.block - 1

    def __len__(self) -> int:
        return len(self.src)

    def lengths(self) -> np.ndarray:
        if isinstance(self.tgt, Ragged):
            return np.maximum(self.src.lengths(), self.tgt.lengths())
        return self.src.lengths()

    def targets(self) -> int:
        """The targets one pass over the split is scored on, as the loss counts them: each sequence's
        tokens after the first, one per class label, each tag that is not ``IGNORE``."""
        if not isinstance(self.tgt, Ragged):
            return len(self.tgt)
        if self.target_pad == IGNORE:
            values = self.tgt.values()
            if values.dtype.kind == "u" or values.min(initial=0) >= 0:  # no IGNORE (an unsigned type holds none:
                return values.size  # a language model's stream is not read through to say so)
            return int(values.size - np.count_nonzero(values == IGNORE))
        return int(self.tgt.lengths().sum()) - len(self.tgt)


def encode_as_text(tokenizer: Tokenizer, texts: list, is_pretokenized: bool = False,
                   word_ids: bool = False) -> list[tuple[list[int], Encoding]]:
    """``(ids, encoding)`` of each text, read as text: ``[EOS]`` or ``[PAD]`` typed in an input is
    characters, never the control token, which would end, pad or restart the sentence where it was typed.

    The tokenizer's matching of its special tokens in raw text is turned off, and a control id a
    tokenizer still makes of a word (a fixed vocabulary lists ``[EOS]`` as a word) becomes ``[UNK]``.
    The encodings know which word each token came from (``Encoding.word_ids``) only with ``word_ids``:
    without, the tokenizer keeps no offsets (``encode_batch_fast``: the same ids, a fifth sooner, for one
    text as for a batch).
    """
    tokenizer.encode_special_tokens = True
    encode = tokenizer.encode_batch if word_ids else tokenizer.encode_batch_fast
    encodings = encode(texts, is_pretokenized=is_pretokenized)
    return [([i if i >= UNK else UNK for i in e.ids], e) for e in encodings]  # ids below UNK are PAD, BOS and EOS


def is_pair(source) -> bool:
    """Whether a source is a pair of texts (a task with ``Task(pairs=True)``) rather than one text."""
    return isinstance(source, tuple)


def is_blank(source) -> bool:
    """An input with nothing to read: a blank text, or a pair of blank texts (its prediction is blank)."""
    return not "".join(source if is_pair(source) else [source]).strip()


def encode_sources(tokenizer: Tokenizer, texts: list, max_len: int, classify: bool = False,
                   prompt: bool = False) -> tuple[list[list[int]], int]:
    """Source ids with their frame: ``[BOS] + ids`` for classifiers (the "first token" to pool),
    ``ids + [EOS]`` for encoder-decoders, the bare ids of a decoder-only model's ``prompt``. Truncates
    to ``max_len`` and counts how many were cut; a prompt keeps its end, the context of what follows.
    A classifier's sources may be pairs of texts instead: see :func:`encode_pairs`."""
    if classify and texts and is_pair(texts[0]):
        return encode_pairs(tokenizer, texts, max_len)
    ids = [x for x, _ in encode_as_text(tokenizer, texts)]
    if prompt:
        return [x[-max_len:] for x in ids], sum(len(x) > max_len for x in ids)
    room = max_len - 1
    cut = sum(len(x) > room for x in ids)
    if classify:
        return [[BOS] + x[:room] for x in ids], cut
    return [x[:room] + [EOS] for x in ids], cut


def encode_pairs(tokenizer: Tokenizer, pairs: list[tuple[str, str]], max_len: int) -> tuple[list[list[int]], int]:
    """Pairs of texts framed as BERT frames them, ``[BOS] + first + [EOS] + second + [EOS]``.

    The end token separates the texts: every tokenizer has it, and no typed text gives it (see
    :func:`encode_as_text`), so the model's segment of each position follows from the frame
    (:func:`taskformer.core.model.segment_ids`). A pair longer than ``max_len`` loses tokens from the
    end of its longer text first (Hugging Face's ``longest_first``), so both texts keep their start.
    Returns the ids and how many pairs were cut.
    """
    firsts = encode_as_text(tokenizer, [first for first, _ in pairs])
    seconds = encode_as_text(tokenizer, [second for _, second in pairs])
    room, src, cut = max_len - 3, [], 0
    for (first, _), (second, _) in zip(firsts, seconds):
        keep = min(len(first), max(room // 2, room - len(second)))  # of the first text; the second gets the rest
        src.append([BOS] + first[:keep] + [EOS] + second[: room - keep] + [EOS])
        cut += len(first) + len(second) > room
    return src, cut


def encode_text(tokenizer: Tokenizer, rows: Sequence, block: int, training: bool = False) -> Encoded:
    """A decoder-only model's split: every ``(prompt, text)`` row as blocks of ``block`` inputs, each
    position's target the next token.

    The text is tokenized once and cut into consecutive blocks (as GPT-2 and nanoGPT train): block
    ``k`` reads tokens ``k * block .. (k + 1) * block - 1`` and predicts the tokens one further, so
    every token after the first is a target exactly once. Rows without a prompt are running text:
    their tokens join one stream in order (a corpus split into lines or files loses no context at
    the joins), written to a file chunk by chunk and memory-mapped (:class:`Spilled`), never held in
    memory whole; its blocks are windows of that one array. A row with a prompt is an example of its
    own, ``prompt + text + [EOS]``: the prompt is context, its positions are ``IGNORE`` (not
    scored), and EOS teaches where a continuation ends. ``owners`` says which row the scored
    targets belong to, so scores can be summed per row (evaluation only): taken in block order, the
    first ``owners[0, 1]`` targets are row ``owners[0, 0]``'s, the next ``owners[1, 1]`` row
    ``owners[1, 0]``'s, and so on (a run per row, not a row id per token). The ``training`` split
    keeps the stream, to be cut anew each epoch (:meth:`Encoded.for_epoch`), and drops the stream's
    last block or two, which no offset would keep whole.
    """
    dtype = id_dtype(tokenizer.get_vocab_size())
    streams = Spilled(dtype)
    plain: list[np.ndarray] = []  # the stream's rows and their token counts, a (row, count) pair each
    prompted: list[tuple[list[int], list[int]]] = []  # (ids, owner of each id or -1 where not scored)
    for chunk in text_chunks(rows):
        prompts = tokenizer.encode_batch([prompt for _, prompt, _ in chunk])
        texts = [t.ids for t in tokenizer.encode_batch([text for _, _, text in chunk])]
        running = []
        for (i, _, _), p, t in zip(chunk, prompts, texts):
            if p.ids:
                prompted.append((p.ids + t + [EOS], [-1] * len(p.ids) + [i] * (len(t) + 1)))
            else:
                running.append((i, t))
        part = Ragged.of([t for _, t in running], dtype)
        streams.append(part.flat)  # to disk: the parts are never held beside the whole stream
        plain.append(np.stack([np.asarray([i for i, _ in running], dtype=np.int64), part.lengths()], axis=1))
    stream = streams.array()
    enc = Encoded(Ragged.of([]), Ragged.of([]), target_pad=IGNORE)
    if training and len(stream) > 2 * block + 1:  # the stream's blocks come first: offset 0 for now
        enc.stream, enc.block = stream, block
    src, tgt, owners = [], [], []
    ends = enc.stream_blocks() * block if enc.stream is not None else len(stream) - 1
    if ends > 0:
        edges = np.append(np.arange(0, ends, block, dtype=np.int64), ends)
        src.append(Ragged(stream, edges))
        tgt.append(Ragged(stream, edges + 1))
        runs = np.concatenate(plain)
        row_starts = starts(runs[:, 1])  # stream positions 1..ends are the targets
        runs[:, 1] = np.diff(np.clip(row_starts, 1, ends + 1))
        owners.append(runs)
    if prompted:
        rows_src, rows_tgt = [], []
        for ids, who in prompted:
            for start in range(0, len(ids) - 1, block):
                targets = range(start + 1, min(start + block + 1, len(ids)))
                rows_src.append(ids[start : targets.stop - 1])
                rows_tgt.append([ids[j] if who[j] >= 0 else IGNORE for j in targets])
            owners.append(np.asarray([[who[-1], sum(w >= 0 for w in who[1:])]], dtype=np.int64))
        src.append(Ragged.of(rows_src, dtype))
        tgt.append(Ragged.of(rows_tgt))
    if src:
        enc.src, enc.tgt = Ragged.concat(src), Ragged.concat(tgt)
    if not training:
        runs = np.concatenate(owners) if owners else np.zeros((0, 2), np.int64)
        enc.owners = runs[runs[:, 1] > 0]
    return enc


TEXT_CHUNK = 1 << 20  # characters of running text tokenized at once (a tokenizer's Encoding costs ~100 bytes a token)


def text_chunks(rows: Sequence) -> Iterator[list[tuple[int, str, str]]]:
    """``(row, prompt, text)`` of a language model's rows, about :data:`TEXT_CHUNK` characters at a
    time. A text longer than that (a whole book as one row) is cut after a line break, so its
    tokenization holds a piece of it at once; a subword tokenizer may then tokenize the first word
    of a piece as it would a word after a space."""
    chunk: list[tuple[int, str, str]] = []
    size = 0
    for i, row in enumerate(each_row(rows)):
        prompt, text = row[0], row[1]
        while text:
            if prompt or len(text) <= TEXT_CHUNK:
                piece, text = text, ""
            else:
                cut = text.rfind("\n", 0, TEXT_CHUNK) + 1 or TEXT_CHUNK
                piece, text = text[:cut], text[cut:]
            chunk.append((i, prompt, piece))
            size += len(piece) + len(prompt)
            if size >= TEXT_CHUNK or len(chunk) >= CHUNK:
                yield chunk
                chunk, size = [], 0
        if not row[1]:
            chunk.append((i, prompt, ""))
    if chunk:
        yield chunk


def encode_words(tokenizer: Tokenizer, texts: list[str], max_len: int) -> tuple[list[list[int]], list[list[int]], int]:
    """Tagging sources, framed ``[BOS] + ids`` like a classifier's, and where each word starts.

    A word is a whitespace-separated piece of the text, tokenized on its own, so a subword tokenizer
    may split it into several tokens. ``words[i][w]`` is the position in ``src[i]`` of the first token
    of word ``w``: its tag is learned and predicted there, and its other tokens carry none (as in
    BERT's token classification). It is ``-1`` for a word cut off by ``max_len`` or that gave no token.
    """
    pieces = [t.split() for t in texts]
    room = max_len - 1
    src, words, cut = [], [], 0
    for row, (ids, e) in zip(pieces, encode_as_text(tokenizer, pieces, is_pretokenized=True, word_ids=True)):
        starts = [-1] * len(row)
        for pos, w in enumerate(e.word_ids[:room], start=1):
            if w is not None and starts[w] < 0:
                starts[w] = pos
        src.append([BOS] + ids[:room])
        words.append(starts)
        cut += len(ids) > room
    return src, words, cut


def encode_ids(tokenizer: Tokenizer, texts: list) -> Ragged:
    """:func:`encode_as_text` of ``texts`` as flat arrays: a control id made of a word becomes ``[UNK]``."""
    tokenizer.encode_special_tokens = True
    ids = Ragged.of([e.ids for e in tokenizer.encode_batch(texts)], id_dtype(tokenizer.get_vocab_size()))
    ids.flat[ids.flat < UNK] = UNK  # ids below UNK are PAD, BOS and EOS
    return ids


def encode(data: TaskData, split: str, max_len: int, variant: str) -> Encoded:
    """One split as ids for a model of ``variant``, in its batch layout (see :mod:`taskformer.core.variants`).

    The rows are read and encoded :data:`CHUNK` at a time (the tokenizer's batch encoding uses every
    core), into flat arrays of the narrowest type the vocabulary allows (:func:`id_dtype`)."""
    rows, kind, tok = data.splits[split], variants.of(variant), data.tokenizer
    if not kind.encoder:
        return encode_text(tok, rows, max_len, training=split == "train")
    index = {name: i for i, name in enumerate(data.labels or [])}
    return joined(encoded_chunks(tok, rows, kind, index, max_len), kind.per_word, len(index))


def encoded_chunks(tok: Tokenizer, rows: Sequence, kind: variants.Variant, index: dict[str, int],
                   max_len: int) -> Iterator[Encoded]:
    """The rows of a split encoded :data:`CHUNK` at a time (see :func:`encode`)."""
    dtype = id_dtype(tok.get_vocab_size())
    for chunk in chunks(rows):
        sources = [row[0] for row in chunk]
        if kind.per_word:
            src, words, cut = encode_words(tok, sources, max_len)
            tags = [[IGNORE] * len(ids) for ids in src]
            for row, starts, (_, target, *_) in zip(tags, words, chunk):
                for pos, tag in zip(starts, target.split()):
                    if pos >= 0:
                        row[pos] = index[tag]
            yield Encoded(Ragged.of(src, dtype), Ragged.of(tags), cut, target_pad=IGNORE)
        elif kind.labelled:
            if sources and is_pair(sources[0]):
                pairs, cut = encode_pairs(tok, sources, max_len)
                ids = Ragged.of(pairs, dtype)
            else:
                ids, cut = frame(encode_ids(tok, sources), max_len - 1, head=[BOS])
            targets = [row[1] for row in chunk]
            soft = None
            if any(isinstance(t, dict) for t in targets):
                soft = [[t.get(name, 0.0) if isinstance(t, dict) else float(name == t) for name in index]
                        for t in targets]
                classes = [max(range(len(p)), key=p.__getitem__) for p in soft]
            else:
                classes = [index[t] for t in targets]
            yield Encoded(ids, np.asarray(classes, dtype=np.int64), cut,
                          soft=None if soft is None else np.asarray(soft, dtype=np.float32))
        else:
            ids, cut = frame(encode_ids(tok, sources), max_len - 1, tail=[EOS])
            tgt, _ = frame(encode_ids(tok, [row[1] for row in chunk]), max_len - 2, head=[BOS], tail=[EOS])
            yield Encoded(ids, tgt, cut)


def joined(parts: Iterable[Encoded], tagging: bool, classes: int) -> Encoded:
    """The encoded chunks of a split, taken as they come, as one :class:`Encoded`. Each chunk's ids
    go to a temporary file (:class:`~taskformer.core.arrays.Spilled`), mapped once whole: chunks
    kept in a list and joined hold every chunk beside the whole, in a heap that the chunks' passing
    tokenizations leave fragmented."""
    ids: dict[str, Spilled] = {}
    lengths: dict[str, list[np.ndarray]] = {"src": [], "tgt": []}
    labels: list[np.ndarray] = []
    soft: list[tuple[np.ndarray | None, np.ndarray]] = []
    truncated, pad_with = 0, IGNORE if tagging else PAD
    for part in parts:
        pad_with, truncated = part.target_pad, truncated + part.truncated
        for name, rows in (("src", part.src), ("tgt", part.tgt)):
            if isinstance(rows, Ragged):
                values = rows.values()
                spilled = ids.setdefault(name, Spilled(values.dtype))
                if not np.can_cast(values.dtype, spilled.dtype):
                    raise ValueError(f"a chunk of {values.dtype} ids after chunks of {spilled.dtype}")
                spilled.append(values)
                lengths[name].append(rows.lengths())
            else:
                labels.append(rows)
                soft.append((part.soft, rows))
    if "src" not in ids:
        return Encoded(Ragged.of([]), Ragged.of([]), target_pad=pad_with)
    src = Ragged(ids["src"].array(), starts(np.concatenate(lengths["src"])))
    if "tgt" in ids:
        return Encoded(src, Ragged(ids["tgt"].array(), starts(np.concatenate(lengths["tgt"]))), truncated, pad_with)
    distributions = None
    if any(p is not None for p, _ in soft):  # a chunk of hard labels: each a distribution on its class
        distributions = np.concatenate([p if p is not None else np.eye(classes, dtype=np.float32)[t] for p, t in soft])
    return Encoded(src, np.concatenate(labels), truncated, pad_with, soft=distributions)


def token_batches(lengths: Indices, max_tokens: int, seed: int | None = None) -> list[Batch]:
    """Group example indices into batches of at most ``max_tokens`` padded tokens.

    Sorting by length first means little padding is wasted; a seed shuffles both the order of
    equal-length examples and the order of the batches, so each epoch differs but is reproducible.
    A batch of examples no longer than ``L`` holds ``max_tokens // L`` of them (at least one).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if not len(lengths):
        return []
    rng = np.random.default_rng(seed % 2**63) if seed is not None else None
    order = rng.permutation(len(lengths)) if rng else np.arange(len(lengths))
    if lengths.min() == lengths.max():  # one length (a language model's blocks): the same batches, unsorted
        cap = max(max_tokens // max(int(lengths[0]), 1), 1)
        batches = np.split(order, np.arange(cap, len(order), cap))
        return [batches[i] for i in rng.permutation(len(batches))] if rng else batches
    order = order[np.argsort(lengths[order], kind="stable")]  # stable: shuffled ties stay shuffled
    ordered = lengths[order]
    cuts, start = [], 0  # where each batch after the first begins in ``order``
    groups = np.flatnonzero(np.diff(ordered)) + 1  # where a longer length begins
    for begin, end in zip(np.r_[0, groups], np.r_[groups, len(order)]):
        cap = max(max_tokens // max(int(ordered[begin]), 1), 1)
        pos = int(begin)
        while pos < end:
            if pos - start >= cap:
                cuts.append(pos)
                start = pos
            pos += min(int(end) - pos, cap - (pos - start))
    batches = np.split(order, cuts)
    if rng:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def pad(seqs: Sequence[Sequence[int]], value: int = PAD) -> torch.Tensor:
    """Right-pad id rows (lists or arrays) with ``value`` into a (N, max length) tensor."""
    import torch  # here, not above: a task's declaration imports this module, and listing tasks needs no torch

    out = np.full((len(seqs), max(len(s) for s in seqs)), value, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return torch.from_numpy(out)


def collate(enc: Encoded, index: Indices) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's padded sources and its targets: padded id rows, class ids, or a classifier's target
    distributions ``(B, C)`` where the split has soft targets."""
    import torch

    src = pad([enc.src[i] for i in index])
    if enc.soft is not None:
        return src, torch.from_numpy(np.ascontiguousarray(enc.soft[np.asarray(index)], dtype=np.float32))
    if isinstance(enc.tgt, Ragged):
        return src, pad([enc.tgt[i] for i in index], enc.target_pad)
    return src, torch.from_numpy(np.asarray(enc.tgt[np.asarray(index)], dtype=np.int64))


CHUNK = 50_000  # rows read, tokenized and encoded at once: the tokenizer's batches keep every core busy


def chunks(split: Sequence, size: int = CHUNK) -> Iterator[list[tuple]]:
    """The rows of a split ``size`` at a time, as tuples: a list, any sized and indexable sequence
    of rows, or a ``datasets.Dataset`` (see :func:`rows`)."""
    for start in range(0, len(split), size):
        yield rows(split, start, start + size)


def each_row(split: Sequence) -> Iterator[tuple]:
    """Every row of a split as a tuple, read a chunk at a time (see :func:`rows`)."""
    for chunk in chunks(split):
        yield from chunk


def rows(split: Sequence, start: int = 0, stop: int | None = None) -> list[tuple]:
    """Rows ``start:stop`` of a split as ``(source, target)`` or ``(source, target, fields)`` tuples.

    A ``datasets.Dataset`` has a ``source`` and a ``target`` column; its other columns, if any, are
    each row's fields. Anything else is indexed row by row (a list is sliced)."""
    stop = len(split) if stop is None else min(stop, len(split))
    if hasattr(split, "column_names") and hasattr(split, "select"):  # a datasets.Dataset, read a batch at once
        if not {"source", "target"} <= set(split.column_names):
            raise DataError(f"a datasets.Dataset split needs a 'source' and a 'target' column; it has "
                            f"{', '.join(split.column_names)}")
        batch = cast(Any, split)[start:stop]
        extra = [c for c in split.column_names if c not in ("source", "target")]
        fields = [{c: batch[c][i] for c in extra} for i in range(stop - start)] if extra else None
        pairs = zip(batch["source"], batch["target"])
        return [(_source(s), t, fields[i]) if fields else (_source(s), t) for i, (s, t) in enumerate(pairs)]
    if isinstance(split, (list, tuple)):
        return [tuple(row) if not isinstance(row, tuple) else row for row in split[start:stop]]
    return [tuple(split[i]) for i in range(start, stop)]


def _source(value):
    """A source column's value: a text, or for a task of pairs two texts (a list in Arrow)."""
    return tuple(value) if isinstance(value, list) else value
