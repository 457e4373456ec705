"""Search over the decoder: greedy search, sampling and beam search, batched, with a key/value cache.

With the cache each step feeds only the newest token through the decoder, so a step costs one
position instead of a re-run of the whole prefix. An encoder-decoder's output starts from BOS; a
decoder-only model's continues its prompt, which the first step reads whole.

A *constraint* lets a task shape the search without owning it: it is called every step as
``constraint(step, prefix, logprobs) -> logprobs`` where ``prefix`` holds the tokens so far (BOS
first, or the prompt) and ``logprobs`` (N, V) may be edited, e.g. set to ``-inf`` for banned tokens.
Rows are ordered sentence-major: row ``i * beam + k`` is hypothesis ``k`` of sentence ``i``.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, Protocol, TypeVar

import numpy as np
import torch

from taskformer.core import precision
from taskformer.core.data import encode_as_text
from taskformer.core.decode_config import DecodeConfig  # noqa: F401 -- the search's settings, named here too
from taskformer.core.errors import TaskformerError
from taskformer.core.model import BOS, EOS, PAD, UNK, SequenceModel


class Constraint(Protocol):
    """Shapes a search without owning it: called at every step of greedy search, sampling and beam search.

    ``constraint(step, prefix, logprobs)`` receives the step (0 for the first output token),
    ``prefix`` (N, step + 1), the tokens so far with BOS first (a decoder-only model's: (N, P +
    step), its prompt of P tokens first), and ``logprobs`` (N, V), the model's log-probabilities of
    every next token for each row; it returns them edited: ``-inf`` bans a token, a subtracted
    penalty discourages it; sampling draws from what it returns. Rows are sentence-major: in beam
    search row ``i * beam + k`` is hypothesis ``k`` of sentence ``i``; greedy search and sampling
    have one row per sentence.
    With a constraint, finished rows stay in the batch, so row ``i`` is always the same sentence. A
    row past its length budget arrives with only ``PAD`` allowed: leave ``PAD`` allowed. Give it as
    ``search(model, src, config.decode, constraint=...)``; the ``couplet`` task's form and tone
    rules are one.

    Example (outputs spelt only with the letters of an alphabet)::

        import torch
        from taskformer import EOS, PAD, hookimpl, search

        def alphabet_only(tokenizer, alphabet):
            allowed = torch.zeros(tokenizer.get_vocab_size(), dtype=torch.bool)
            for token, i in tokenizer.get_vocab().items():
                allowed[i] = set(token.replace("\u2581", "")) <= set(alphabet)  # \u2581: a word start
            allowed[[PAD, EOS]] = True

            def constraint(step, prefix, logprobs):
                return logprobs.masked_fill(~allowed.to(logprobs.device), float("-inf"))
            return constraint

        @hookimpl
        def taskformer_decode(model, src, tokenizer, config):
            ids = search(model, src, config.decode, constraint=alphabet_only(tokenizer, "aeiou"))
            return [tokenizer.decode(x) for x in ids]
    """

    def __call__(self, step: int, prefix: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor: ...


Item = TypeVar("Item")
Result = TypeVar("Result")
NEVER_WRITTEN = [PAD, BOS, UNK]  # special tokens no search writes: they decode to nothing (a row past its budget pads)


def max_lengths(src: torch.Tensor, a: float, b: int, cap: int) -> torch.Tensor:
    """Per-sentence output budget ``a * source_length + b`` (without BOS), capped by the model's positions."""
    n = (src != PAD).sum(1)
    return (n.float() * a + b).clamp(1, cap - 1).long()  # clamped before the cast: a huge a means the cap


def _strip(row: list[int], start: int = 1) -> list[int]:
    """The output: the tokens after the first ``start`` (BOS, or the prompt), up to (not including) EOS."""
    out = []
    for t in row[start:]:
        if t in (EOS, PAD):
            break
        out.append(t)
    return out


def argmax(x: torch.Tensor, block: int = 64) -> torch.Tensor:
    """``x.argmax(-1)`` for (N, V) scores, first maximum on ties, in two vectorised passes.

    PyTorch's CPU arg-max over a long last dimension runs ~6x slower than its plain maximum, and
    it was a tenth of a greedy step: find the block of ``block`` scores holding the maximum first,
    then the position inside it.
    """
    n, v = x.shape
    if v % block:
        x = torch.nn.functional.pad(x, (0, block - v % block), value=float("-inf"))
    blocks = x.view(n, -1, block)
    top = blocks.amax(-1).argmax(-1)
    return top * block + blocks[torch.arange(n, device=x.device), top].argmax(-1)


class Memory(NamedTuple):
    """The encoded source, once per sentence: states (B, S, D) and the mask cross-attention uses
    (``None`` when no row is padded, as length-sorted batches often are not, for its faster unmasked
    path); and the key mask of every search row (B * K, 1, 1, S), the one the head receives."""

    states: torch.Tensor | None  # a decoder-only model has none
    mask: torch.Tensor
    cross_mask: torch.Tensor | None

    @classmethod
    def of(cls, model: SequenceModel, src: torch.Tensor, rows_per_sentence: int = 1) -> Memory:
        states, mask = model.encode(src)  # a decoder-only model has no states: the prompt is read as a prefix
        return cls(states, mask.repeat_interleave(rows_per_sentence, 0), None if bool(mask.all()) else mask)

    def rows(self, rows: torch.Tensor, sentences: torch.Tensor) -> Memory:
        """The memory of search rows ``rows``, which belong to ``sentences``."""
        cross = None if self.cross_mask is None else self.cross_mask[sentences]
        return Memory(None if self.states is None else self.states[sentences], self.mask[rows], cross)


def _prefix(model: SequenceModel, src: torch.Tensor, rows_per_sentence: int = 1) -> torch.Tensor:
    """Every search row's first tokens: BOS for an encoder-decoder, a decoder-only model's prompt, and
    BOS for an empty prompt (``src`` of no column): sampling from nothing, as GPT-2 starts a text
    from its end-of-text token. The output follows, so BOS is never part of it."""
    if model.cfg.kind.encoder or not src.size(1):
        return torch.full((src.size(0) * rows_per_sentence, 1), BOS, dtype=torch.long, device=src.device)
    if bool((src == PAD).any()):  # a continuation would follow the padding
        raise TaskformerError("a decoder-only search continues prompts of one length per batch: src holds padding")
    return src.repeat_interleave(rows_per_sentence, 0)


class Reader:
    """Feeds the decoder the tokens of each row that it has not read yet, through a key/value cache.

    An encoder-decoder's outputs fit its positions (their budget is capped). A decoder-only model
    may write past ``model.max_len``: its context then slides, as nanoGPT's sampling crops it, but
    a quarter of the positions at a time: the cache is rebuilt from the last three quarters of
    ``max_len`` tokens, which take positions from 0 again.
    """

    def __init__(self, model: SequenceModel, steps: int):
        self.model, self.room = model, model.cfg.max_len
        self.cache = model.new_cache(min(steps, self.room))
        self.read = self.first = 0  # columns of the prefix in the cache; the column at position 0
        self.static = getattr(model, "static", False)  # a compiled step: positions as tensors (core/compiled.py)

    def next_states(self, ys: torch.Tensor, memory: Memory) -> torch.Tensor:
        """The decoder's state (N, 1, D) at the last token of every row of ``ys``."""
        if ys.size(1) - self.first > self.room:
            self.first = ys.size(1) - self.room * 3 // 4
            self.read, self.cache = self.first, self.model.new_cache(self.room)
        start = self.read - self.first
        h = self.model.decode(ys[:, self.read :], memory.states, memory.cross_mask, cache=self.cache,
                              start=torch.tensor(start, device=ys.device) if self.static else start)
        self.read = ys.size(1)
        return h[:, -1:]

    def keep(self, rows: torch.Tensor, sentences: torch.Tensor | None = None) -> None:
        """Keep only the cache rows ``rows`` (see ``Transformer.reorder_cache``)."""
        self.model.reorder_cache(self.cache, rows, sentences)


def ban_repeats(prefix: torch.Tensor, logp: torch.Tensor, n: int) -> torch.Tensor:
    """Ban (``-inf``) every token that would write an ``n``-gram the row's ``prefix`` (N, L) already holds.

    Undertrained and small models loop ("Red Sox Sox Sox"); fairseq's ``--no-repeat-ngram-size`` and
    Hugging Face's ``no_repeat_ngram_size`` stop them so: each earlier ``n``-gram whose first ``n - 1``
    tokens equal the row's last ``n - 1`` bans its last token. A decoder-only model's prompt counts.
    A row left with nothing allowed ends (EOS): there is nothing more it can write without repeating.
    """
    if n <= 0 or prefix.size(1) < n:
        return logp
    grams = prefix.unfold(1, n, 1)  # (N, L - n + 1, n): every n-gram so far
    seen = (grams[:, :, :-1] == prefix[:, prefix.size(1) - n + 1 :].unsqueeze(1)).all(-1)  # ..starts as the row ends
    hits = torch.zeros_like(logp).scatter_add_(1, grams[:, :, -1], seen.to(logp.dtype))
    logp = logp.masked_fill(hits > 0, float("-inf"))
    logp[logp.isneginf().all(-1), EOS] = 0.0
    return logp


def _next_logprobs(model, ys, memory: Memory, reader: Reader, step, limit, ignore_eos, constraint, normalize=True,
                   no_repeat_ngram=0):
    """Log-probabilities of the next token for every row, with the length budget, the repetition ban
    (:func:`ban_repeats`) and the constraint applied.

    ``normalize=False`` returns raw logits instead: plain greedy search only needs their argmax.
    """
    logp = model.head(reader.next_states(ys, memory), memory.mask)[:, -1].float()  # head(hidden, src_mask)
    if normalize:
        logp = torch.log_softmax(logp, dim=-1)
    if ignore_eos:
        logp[:, EOS] = float("-inf")
    logp[:, NEVER_WRITTEN] = float("-inf")  # an output is text: of the special tokens it writes EOS only
    logp = ban_repeats(ys, logp, no_repeat_ngram)
    at_limit = limit <= step  # rows that used up their budget are cut: they may only pad, at no cost
    if at_limit.any():
        logp[at_limit] = float("-inf")
        logp[at_limit, PAD] = 0.0
    return logp if constraint is None else constraint(step, ys, logp)


def _steady_attention(search_fn):
    """Run a search with :func:`precision.steady_attention` on its source's device."""
    @functools.wraps(search_fn)
    def run(model, src: torch.Tensor, *args, **kwargs):
        with precision.steady_attention(src.device):
            return search_fn(model, src, *args, **kwargs)
    return run


def _one_per_row(model: SequenceModel, src: torch.Tensor, max_len: torch.Tensor, pick, normalize: bool,
                 constraint: Constraint | None, ignore_eos: bool, drop_finished: bool,
                 no_repeat_ngram: int) -> list[list[int]]:
    """The search of greedy and sampling: one output per row, its next token ``pick(scores, rows)`` of the
    scores of the rows still searched. Rows that end (EOS or budget) leave the batch with
    ``drop_finished``, unless a constraint reads the whole batch's rows."""
    memory, start = Memory.of(model, src), _prefix(model, src)
    steps, width = int(max_len.max()), start.size(1)
    ys = torch.full((src.size(0), width + steps), PAD, dtype=torch.long, device=src.device)
    ys[:, :width] = start
    live = torch.arange(src.size(0), device=src.device)  # the rows still searched
    limit, done = max_len, torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    reader = Reader(model, width + steps)
    drop = drop_finished and constraint is None
    for step in range(steps):
        logp = _next_logprobs(model, ys[live, : width + step], memory, reader, step, limit, ignore_eos, constraint,
                              normalize=normalize or constraint is not None, no_repeat_ngram=no_repeat_ngram)
        nxt = pick(logp, live).masked_fill(done, PAD)
        ys[live, width + step] = nxt
        done = done | (nxt == EOS) | (limit <= step + 1)
        if done.all():
            break
        if drop and done.any():
            keep = (~done).nonzero().squeeze(1)
            live, limit, done = live[keep], limit[keep], done[keep]
            memory = memory.rows(keep, keep)
            reader.keep(keep, keep)
    return [_strip(r, width) for r in ys.tolist()]


@torch.inference_mode()
@_steady_attention
def greedy(model: SequenceModel, src: torch.Tensor, max_len: torch.Tensor, constraint: Constraint | None = None,
           ignore_eos: bool = False, *, drop_finished: bool = True, no_repeat_ngram: int = 0) -> list[list[int]]:
    """Pick the most likely token at every step. ``max_len`` (B,) bounds each output (without BOS).

    ``ignore_eos`` never ends an output before its budget: each is exactly ``max_len`` tokens, for a
    task that knows its output's length (the reverse example).
    Rows that end (EOS or budget) leave the batch, unless a constraint reads the whole batch's rows;
    ``drop_finished=False`` keeps them to the end (the batch keeps its size: a benchmark's baseline).
    ``no_repeat_ngram`` (0: off) bans writing any n-gram of that size twice (:func:`ban_repeats`).
    """
    return _one_per_row(model, src, max_len, lambda logp, rows: argmax(logp), False, constraint, ignore_eos,
                        drop_finished, no_repeat_ngram)


def truncate(logp: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The distribution sampling draws from, as logits (N, V): ``logp`` divided by ``temperature``, cut to
    its ``top_k`` most likely tokens (0: all), then to the fewest whose probability reaches ``top_p``
    (nucleus sampling, Holtzman et al., 2020; 1: all). The most likely token always stays.

    Any temperature or ``top_p`` in range gives a distribution: the most likely token's logit is 0
    before the division, and the temperature is held within the dtype's finite, normal numbers, so
    a tiny one is greedy search and a huge one uniform, never 0 / 0 or inf / inf."""
    limits = torch.finfo(logp.dtype)
    logits = (logp - logp.amax(-1, keepdim=True)) / min(max(temperature, limits.tiny), limits.max)
    if 0 < top_k < logits.size(-1):
        logits = logits.masked_fill(logits < logits.topk(top_k, dim=-1).values[:, -1:], float("-inf"))
    if top_p < 1.0:
        ranked, order = logits.sort(dim=-1, descending=True)
        probs = ranked.softmax(-1)
        before = probs.cumsum(-1) - probs  # the probability of the tokens ranked above each
        cut = before >= top_p
        cut[:, 0] = False  # the most likely token, whatever top_p rounds to in the dtype
        logits = logits.scatter(-1, order, ranked.masked_fill(cut, float("-inf")))
    return logits


@torch.inference_mode()
@_steady_attention
def sample(model: SequenceModel, src: torch.Tensor, max_len: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
           top_p: float = 1.0, seed: int = 0, constraint: Constraint | None = None,
           ignore_eos: bool = False, *, drop_finished: bool = True, no_repeat_ngram: int = 0) -> list[list[int]]:
    """Draw every token from the model's distribution (after the constraint), shaped by :func:`truncate`.

    Each row draws from a random generator of its own, seeded with ``seed``: the same input and seed
    give the same output whatever else shares its batch (or a server's). ``top_k=1`` is greedy search.
    Rows that end leave the batch as in :func:`greedy` (``drop_finished``), whose ``no_repeat_ngram`` it shares.
    """
    generators = [torch.Generator(device=src.device).manual_seed(seed) for _ in range(src.size(0))]

    def pick(logp: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        probs = truncate(logp, temperature, top_k, top_p).softmax(-1)
        return torch.cat([torch.multinomial(p, 1, generator=generators[i]) for p, i in zip(probs, rows.tolist())])

    return _one_per_row(model, src, max_len, pick, True, constraint, ignore_eos, drop_finished, no_repeat_ngram)


def _best(ys: torch.Tensor, scores: torch.Tensor, length_penalty: float, start: int = 1) -> list[list[int]]:
    """The best hypothesis of each sentence by ``score / ((5 + length) / 6) ** length_penalty``; the
    output begins after column ``start``."""
    n, k = scores.shape
    lengths = (ys[:, start:] != PAD).sum(1).view(n, k).float()
    pick = (scores / ((5.0 + lengths) / 6.0) ** length_penalty).argmax(-1) + torch.arange(n, device=ys.device) * k
    return [_strip(r, start) for r in ys[pick].tolist()]


@torch.inference_mode()
@_steady_attention
def beam_search(model: SequenceModel, src: torch.Tensor, max_len: torch.Tensor, beam: int = 5,
                length_penalty: float = 1.0, constraint: Constraint | None = None,
                ignore_eos: bool = False, *, drop_finished: bool = True, no_repeat_ngram: int = 0) -> list[list[int]]:
    """Keep the ``beam`` best prefixes per sentence; return the best finished one per sentence.

    A finished hypothesis stays in its beam with a frozen score (it can only be extended by PAD at
    no cost), so live and finished hypotheses compete on equal terms. At the end hypotheses are
    ranked by ``score / ((5 + length) / 6) ** length_penalty`` (Wu et al., 2016): without it the
    search prefers short outputs, since every extra token lowers a log-probability sum. A sentence
    whose hypotheses have all ended is final: it leaves the batch, unless a constraint reads it (or
    ``drop_finished=False`` keeps it, as :func:`greedy`); ``no_repeat_ngram`` bans repeats per hypothesis, as there.
    The encoder memory and its cross-attention keys/values are held once per sentence, not per
    hypothesis.
    """
    B, K, device = src.size(0), beam, src.device
    memory, limit = Memory.of(model, src, K), max_len.repeat_interleave(K)
    ys = _prefix(model, src, K)
    width = ys.size(1)
    scores = torch.zeros(B, K, device=device)
    scores[:, 1:] = float("-inf")  # all beams start identical: expand only the first one
    done = torch.zeros(B * K, dtype=torch.bool, device=device)
    steps = int(max_len.max())
    reader = Reader(model, width + steps)
    live = torch.arange(B, device=device)  # the sentences still searched
    out: list[list[int]] = [[] for _ in range(B)]  # each sentence's output, once final
    drop = drop_finished and constraint is None
    for step in range(steps):
        logp = _next_logprobs(model, ys, memory, reader, step, limit, ignore_eos, constraint,
                              no_repeat_ngram=no_repeat_ngram)
        if done.any():  # finished hypotheses may only grow by PAD, at no cost
            logp[done] = float("-inf")
            logp[done, PAD] = 0.0
        # The K best continuations of a sentence are among the K best of each of its hypotheses:
        # picking those first keeps the final top-K over K*K candidates instead of K*V (or K*V when
        # the beam is wider than the vocabulary).
        n, C = scores.size(0), min(K, logp.size(-1))
        cand, cand_tok = logp.topk(C, dim=-1)
        top, idx = (scores.view(-1, 1) + cand).view(n, K * C).topk(K, dim=-1)
        origin = (idx // C + torch.arange(n, device=device).unsqueeze(1) * K).view(-1)
        tok = cand_tok.view(n, K * C).gather(1, idx).view(-1)
        ys = torch.cat([ys[origin], tok.unsqueeze(1)], 1)
        done = done[origin] | (tok == EOS)
        scores = top
        reader.keep(origin)
        ended = (done | (limit <= step + 1)).view(n, K).all(1)  # every hypothesis ended or was cut
        if ended.all() or done.all():
            break
        if drop and ended.any():
            for i, best in zip(live[ended].tolist(), _best(ys.view(n, K, -1)[ended].flatten(0, 1), scores[ended],
                                                           length_penalty, width)):
                out[i] = best
            keep = (~ended).nonzero().squeeze(1)
            rows = (keep.unsqueeze(1) * K + torch.arange(K, device=device)).view(-1)
            live, scores, ys, done, limit = live[keep], scores[keep], ys[rows], done[rows], limit[rows]
            memory = memory.rows(rows, keep)
            reader.keep(rows, keep)
    for i, best in zip(live.tolist(), _best(ys, scores, length_penalty, width)):
        out[i] = best
    return out


def search(model: SequenceModel, src: torch.Tensor, config: DecodeConfig, constraint: Constraint | None = None,
           max_len: torch.Tensor | None = None, ignore_eos: bool = False) -> list[list[int]]:
    """Sampling (``config.temperature`` above 0), or beam or greedy search, as ``config`` says: the
    entry point for tasks and the default decoder.

    ``max_len`` (B,) bounds each output (without BOS or the prompt); by default it is
    ``config.max_len_a * source length + config.max_len_b`` for an encoder-decoder, capped by the
    model's positions, and ``config.max_new_tokens`` for a decoder-only model, whose ``src`` is the
    prompt it continues. Returns the output's token ids per row.
    """
    if max_len is None and not model.cfg.kind.encoder:
        max_len = torch.full((src.size(0),), config.max_new_tokens, dtype=torch.long, device=src.device)
    if max_len is None:
        max_len = max_lengths(src, config.max_len_a, config.max_len_b, model.cfg.max_len)
    ban = config.no_repeat_ngram
    if config.temperature > 0:
        return sample(model, src, max_len, config.temperature, config.top_k, config.top_p, config.seed, constraint,
                      ignore_eos, no_repeat_ngram=ban)
    if config.strategy == "beam" and config.beam > 1:
        return beam_search(model, src, max_len, config.beam, config.length_penalty, constraint, ignore_eos,
                           no_repeat_ngram=ban)
    return greedy(model, src, max_len, constraint, ignore_eos=ignore_eos, no_repeat_ngram=ban)


@torch.no_grad()
def classify(model: SequenceModel, src: torch.Tensor) -> torch.Tensor:
    """Class probabilities (B, C) of an encoder-only model."""
    return torch.softmax(model(src).float(), dim=-1)


class Label(NamedTuple):
    """A classifier's prediction; ``str()`` gives the line ``predict`` prints: ``LABEL<TAB>PROBABILITY``.
    A blank input gets ``Label("", 0.0)``, printed as a blank line."""

    label: str
    probability: float

    def __str__(self) -> str:
        return f"{self.label}\t{self.probability:.4f}" if self.label else ""  # a blank input: a blank line


def best_labels(model: SequenceModel, src: torch.Tensor, labels: list[str]) -> list[Label]:
    """The most probable class of each row, as a ``Label(label, probability)``.

    For every class's probability, call :func:`classify`: ``(B, C)``, columns in ``labels`` order.
    """
    return labels_of(classify(model, src).cpu().numpy(), labels)


def labels_of(prob: np.ndarray, labels: list[str]) -> list[Label]:
    """The most probable class of each row of the probabilities ``prob`` (B, C), ties to the first, as
    :func:`best_labels` gives them; ONNX Runtime's probabilities come here as numpy, never as torch."""
    return [Label(labels[i], float(row[i])) for i, row in zip(prob.argmax(-1).tolist(), prob)]


class Attention(NamedTuple):
    """Where an encoder-decoder looked while writing an output (see :func:`cross_attention_map`)."""

    source: list[str]  # source tokens, EOS last
    output: list[str]  # output tokens, EOS last
    weights: list[list[float]]  # (output, source): row t is the attention while predicting output token t


@torch.no_grad()
def cross_attention_map(model: SequenceModel, tokenizer, source: str, output: str) -> Attention:
    """The last decoder layer's cross-attention, mean over heads, with ``output`` fed in as the target
    (teacher forcing). Both sides are truncated to the model's positions, as in decoding."""
    room = model.cfg.max_len - 1
    (src_ids, _), (out_ids, _) = encode_as_text(tokenizer, [source, output])
    src_ids, out_ids = src_ids[:room] + [EOS], out_ids[:room]
    device = next(model.parameters()).device
    model.eval()
    src, tgt_in = torch.tensor([src_ids], device=device), torch.tensor([[BOS] + out_ids], device=device)
    weights = model.attention_maps(src, tgt_in)
    tokens = lambda ids: [tokenizer.id_to_token(i) for i in ids]  # noqa: E731
    return Attention(tokens(src_ids), tokens(out_ids + [EOS]), weights[0].float().cpu().tolist())


@torch.no_grad()
def tag_scores(model: SequenceModel, src: torch.Tensor, words: list[list[int]],
               labels: list[str]) -> list[list[Label]]:
    """The most probable tag of every word with its probability: one ``Label`` per word of each row.

    ``words[i]`` holds the position of each word's first token in row ``i`` (see
    :func:`taskformer.encode_words`), where the tag is read; a word at ``-1``, cut off by the
    model's length, gets ``Label(labels[0], 0.0)``. For every tag's probability, read
    ``torch.softmax(model(src).float(), -1)``: ``(B, S, C)``, one distribution per token.
    """
    top, index = torch.softmax(model(src).float(), dim=-1).max(-1)  # (B, S) each
    prob, best = top.tolist(), index.tolist()
    return [[Label(labels[b[p]], q[p]) if p >= 0 else Label(labels[0], 0.0) for p in starts]
            for b, q, starts in zip(best, prob, words)]


def best_tags(model: SequenceModel, src: torch.Tensor, words: list[list[int]], labels: list[str]) -> list[str]:
    """The most probable tag of every word, as the line ``TAG TAG ...`` (one per word of each row):
    what a tagging task's decoder returns. :func:`tag_scores` gives each tag's probability too."""
    return [" ".join(tag.label for tag in row) for row in tag_scores(model, src, words, labels)]


def word_tags(text: str, tags: str) -> list[tuple[str, str]]:
    """The words of ``text`` as the user wrote them (split at whitespace, punctuation kept), each
    with its tag from a tagger's line ``tags``: what ``predict`` gives for a tagging task. The task's
    normalizer may change a word for the model (lower-case it, drop its full stop) but must keep
    one word per user word: :class:`TaskformerError` names the input where it did not."""
    words, labels = text.split(), tags.split()
    if len(words) != len(labels):
        raise TaskformerError(f"{text!r} has {len(words)} words but {len(labels)} tags: the task's normalizer "
                              "(taskformer_normalize) must keep one word per input word")
    return list(zip(words, labels))


def parallel_map(fn: Callable[[Item], Result], items: Iterable[Item], workers: int) -> Iterator[Result]:
    """``map(fn, items)`` over ``workers`` threads of one intra-op thread each, results in order.

    A decoding step is a chain of small kernels that two cores split poorly (2 threads are ~1.3x
    one); decoding separate batches side by side keeps every core busy. ``fn`` must set its own
    autocast and grad mode: both are per thread. The caller's thread count is restored afterwards.
    """
    if workers <= 1:
        yield from map(fn, items)
        return
    threads = torch.get_num_threads()
    pool = ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,))
    try:
        yield from pool.map(fn, items)
    finally:  # on an error or an early stop, batches not yet started are dropped
        pool.shutdown(cancel_futures=True)
        torch.set_num_threads(threads)  # the workers' setting leaks into the process-wide pool


def decode_workers(workers: int, device: torch.device, batches: int) -> int:
    """Batches decoded at once: ``workers`` if set, else one per intra-op thread on CPU and one on
    GPUs; never more than there are ``batches``."""
    if not workers:
        workers = torch.get_num_threads() if device.type == "cpu" else 1
    return min(workers, batches)
