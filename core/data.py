"""Task-agnostic data plumbing: reading files, encoding text pairs, and token-based batching.

A task's data pipeline hands the core a :class:`TaskData` of raw ``(source, target)`` text pairs
and a trained tokenizer; everything after that -- ids, padding, batching -- happens here.
"""
from __future__ import annotations

import gzip
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tokenizers import Encoding, Tokenizer

from taskformer.core import variants
from taskformer.core.errors import DataError
from taskformer.core.progress import stage
from taskformer.core.tokenize import BOS, EOS, PAD, UNK

if TYPE_CHECKING:
    import torch

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
    """

    tokenizer: Tokenizer
    splits: dict[str, list[tuple[str, str]]]
    labels: list[str] | None = None
    notes: dict[str, Any] = field(default_factory=dict)


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
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read().removeprefix(b"\xef\xbb\xbf")  # a BOM is not part of the first line's text
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read ({e})") from None
    lines = raw.split(b"\n" if b"\n" in raw or b"\r" not in raw else b"\r")  # CR alone: classic Mac line ends
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    with stage(f"reading {path.name}", len(lines), every=20_000) as advance:
        for i, line in enumerate(lines, 1):
            try:
                out.append(line.decode("utf-8").rstrip("\r"))
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{i}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
            advance()
    if not out:
        raise DataError(f"{path}: file is empty")
    if not any(line.strip() for line in out):
        raise DataError(f"{path}: holds only blank lines, no text")
    return out


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


@dataclass
class Encoded:
    """Token ids of one split: sources always; targets as id lists (sequence tasks), class ids, or one
    tag id per source position (tagging, ``IGNORE`` where nothing is scored)."""

    src: list[list[int]]
    tgt: list[list[int]] | list[int]
    truncated: int = 0
    target_pad: int = PAD  # fills a batch's shorter target rows: IGNORE for tags, where 0 is a real tag
    owners: list[list[int]] | None = None  # decoder-only: the split's row each scored target belongs to
    stream: list[int] | None = None  # decoder-only training: the running text its first blocks are cut from
    block: int = 0  # and their length
    soft: list[list[float]] | None = None  # a classifier's target distributions, where any row has one (distillation)

    def for_epoch(self, epoch: int, seed: int) -> Encoded:
        """The examples of training epoch ``epoch``. A language model's running text is cut at another
        offset each epoch (drawn from ``seed`` and ``epoch``, so a resumed run cuts alike): its blocks
        begin anywhere in the text, as nanoGPT's randomly placed ones, instead of at the same places
        every epoch. Every epoch has the same blocks' count and lengths; other data is as it is."""
        if not self.stream:
            return self
        block, offset = self.block, random.Random(seed * 100_003 + epoch).randrange(self.block)
        cut = [self.stream[offset + k * block : offset + (k + 1) * block + 1] for k in range(self.stream_blocks())]
        targets = cast("list[list[int]]", self.tgt)  # a language model's targets are sequences
        return replace(self, src=[ids[:-1] for ids in cut] + self.src[len(cut):],
                       tgt=[ids[1:] for ids in cut] + targets[len(cut):])

    def stream_blocks(self) -> int:
        """Whole blocks of the stream at any offset below a block."""
        if not self.stream:
            return 0
        return (len(self.stream) - 1) // self.block - 1

    def __len__(self) -> int:
        return len(self.src)

    def lengths(self) -> list[int]:
        if self.tgt and isinstance(self.tgt[0], list):
            return [max(len(s), len(t)) for s, t in zip(self.src, self.tgt)]
        return [len(s) for s in self.src]

    def targets(self) -> int:
        """The targets one pass over the split is scored on, as the loss counts them: each sequence's
        tokens after the first, one per class label, each tag that is not ``IGNORE``."""
        if not self.tgt or not isinstance(self.tgt[0], list):
            return len(self.tgt)
        if self.target_pad == IGNORE:
            return sum(t != IGNORE for row in self.tgt for t in row)
        return sum(len(t) - 1 for t in self.tgt)


def encode_as_text(tokenizer: Tokenizer, texts: list, is_pretokenized: bool = False) -> list[tuple[list[int], Encoding]]:
    """``(ids, encoding)`` of each text, read as text: ``[EOS]`` or ``[PAD]`` typed in an input is
    characters, never the control token, which would end, pad or restart the sentence where it was typed.

    The tokenizer's matching of its special tokens in raw text is turned off, and a control id a
    tokenizer still makes of a word (a fixed vocabulary lists ``[EOS]`` as a word) becomes ``[UNK]``.
    """
    tokenizer.encode_special_tokens = True
    return [([i if i >= UNK else UNK for i in e.ids], e)  # ids below UNK are PAD, BOS and EOS
            for e in tokenizer.encode_batch(texts, is_pretokenized=is_pretokenized)]


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


def encode_text(tokenizer: Tokenizer, rows: list[tuple], block: int, training: bool = False) -> Encoded:
    """A decoder-only model's split: every ``(prompt, text)`` row as blocks of ``block`` inputs, each
    position's target the next token.

    The text is tokenized once and cut into consecutive blocks (as GPT-2 and nanoGPT train): block
    ``k`` reads tokens ``k * block .. (k + 1) * block - 1`` and predicts the tokens one further, so
    every token after the first is a target exactly once. Rows without a prompt are running text:
    their tokens join one stream in order (a corpus split into lines or files loses no context at
    the joins). A row with a prompt is an example of its own, ``prompt + text + [EOS]``: the prompt is
    context, its positions are ``IGNORE`` (not scored), and EOS teaches where a continuation ends.
    ``owners`` records the row each target came from, so scores can be summed per row. The
    ``training`` split keeps the stream, to be cut anew each epoch (:meth:`Encoded.for_epoch`), and
    drops the stream's last block or two, which no offset would keep whole.
    """
    prompts = tokenizer.encode_batch([row[0] for row in rows])
    texts = tokenizer.encode_batch([row[1] for row in rows])
    sequences: list[tuple[list[int], list[int]]] = []  # (ids, owner of each id or -1 where not scored)
    stream: list[int] = []
    owner: list[int] = []
    for i, (p, t) in enumerate(zip(prompts, texts)):
        if p.ids:
            sequences.append((p.ids + t.ids + [EOS], [-1] * len(p.ids) + [i] * (len(t.ids) + 1)))
        else:
            stream += t.ids
            owner += [i] * len(t.ids)
    if stream:
        sequences.insert(0, (stream, owner))
    src: list[list[int]] = []
    tgt: list[list[int]] = []
    owners: list[list[int]] = []
    enc = Encoded(src, tgt, target_pad=IGNORE, owners=owners)
    if training and len(stream) > 2 * block + 1:  # the stream's blocks come first: offset 0 for now
        enc.stream, enc.block = stream, block
    for ids, who in sequences:
        ends = enc.stream_blocks() * block if enc.stream is ids else len(ids) - 1
        for start in range(0, ends, block):
            targets = range(start + 1, min(start + block + 1, len(ids)))
            src.append(ids[start : targets.stop - 1])
            tgt.append([ids[j] if who[j] >= 0 else IGNORE for j in targets])
            owners.append([who[j] for j in targets if who[j] >= 0])
    return enc


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
    for row, (ids, e) in zip(pieces, encode_as_text(tokenizer, pieces, is_pretokenized=True)):
        starts = [-1] * len(row)
        for pos, w in enumerate(e.word_ids[:room], start=1):
            if w is not None and starts[w] < 0:
                starts[w] = pos
        src.append([BOS] + ids[:room])
        words.append(starts)
        cut += len(ids) > room
    return src, words, cut


def encode(data: TaskData, split: str, max_len: int, variant: str) -> Encoded:
    """One split as ids for a model of ``variant``, in its batch layout (see :mod:`taskformer.core.variants`)."""
    pairs, kind = data.splits[split], variants.of(variant)
    if not kind.encoder:
        return encode_text(data.tokenizer, pairs, max_len, training=split == "train")
    index = {name: i for i, name in enumerate(data.labels or [])}
    if kind.per_word:
        src, words, cut = encode_words(data.tokenizer, [row[0] for row in pairs], max_len)
        tgt = [[IGNORE] * len(ids) for ids in src]
        for row, starts, (_, tags) in zip(tgt, words, pairs):
            for pos, tag in zip(starts, tags.split()):
                if pos >= 0:
                    row[pos] = index[tag]
        return Encoded(src, tgt, cut, target_pad=IGNORE)
    src, cut = encode_sources(data.tokenizer, [row[0] for row in pairs], max_len, classify=kind.labelled)
    if kind.labelled:
        targets = [row[1] for row in pairs]
        if not any(isinstance(t, dict) for t in targets):
            return Encoded(src, [index[t] for t in targets], cut)
        soft = [[t.get(name, 0.0) if isinstance(t, dict) else float(name == t) for name in index] for t in targets]
        return Encoded(src, [max(range(len(p)), key=p.__getitem__) for p in soft], cut, soft=soft)
    room = max_len - 2
    tgt = [[BOS] + ids[:room] + [EOS] for ids, _ in encode_as_text(data.tokenizer, [row[1] for row in pairs])]
    return Encoded(src, tgt, cut)


def token_batches(lengths: list[int], max_tokens: int, seed: int | None = None) -> list[list[int]]:
    """Group example indices into batches of at most ``max_tokens`` padded tokens.

    Sorting by length first means little padding is wasted; a seed shuffles both the order of
    equal-length examples and the order of the batches, so each epoch differs but is reproducible.
    """
    order = list(range(len(lengths)))
    rng = random.Random(seed) if seed is not None else None
    if rng:
        rng.shuffle(order)
    order.sort(key=lambda i: lengths[i])  # stable: shuffled ties stay shuffled
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for i in order:
        longest_if = max(longest, lengths[i])
        if batch and longest_if * (len(batch) + 1) > max_tokens:
            batches.append(batch)
            batch, longest_if = [], lengths[i]
        batch.append(i)
        longest = longest_if
    if batch:
        batches.append(batch)
    if rng:
        rng.shuffle(batches)
    return batches


def pad(seqs: list[list[int]], value: int = PAD) -> torch.Tensor:
    """Right-pad id lists with ``value`` into a (N, max length) tensor."""
    import torch  # here, not above: a task's declaration imports this module, and listing tasks needs no torch

    out = torch.full((len(seqs), max(len(s) for s in seqs)), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def collate(enc: Encoded, index: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's padded sources and its targets: padded id rows, class ids, or a classifier's target
    distributions ``(B, C)`` where the split has soft targets."""
    import torch

    src = pad([enc.src[i] for i in index])
    if enc.soft is not None:
        return src, torch.tensor([enc.soft[i] for i in index], dtype=torch.float32)
    if isinstance(enc.tgt[0], list):
        return src, pad([enc.tgt[i] for i in index], enc.target_pad)
    return src, torch.tensor([enc.tgt[i] for i in index], dtype=torch.long)
