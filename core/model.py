"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), in one file.

Four variants (:mod:`taskformer.core.variants`) share every building block:

* ``encoder-decoder`` -- source tokens are encoded once; the decoder attends to its own prefix
  (causal self-attention) and to the encoder memory (cross-attention). Used for sequence tasks.
* ``encoder-only`` -- just the encoder stack; a head pools it into class logits (classification).
  With ``pairs`` its input is two texts read as one sequence, each token told its text by a
  learned segment embedding (sentence-pair classification, as BERT; Devlin et al., 2019).
* ``tagging`` -- the same encoder stack; a head gives label logits at every source position.
* ``decoder-only`` -- just the decoder stack, without cross-attention: each position attends to
  itself and the positions before it, and the tied output projection predicts the next token (a
  language model, the shape of GPT; Radford et al., 2018). The prompt is the decoder's prefix.

Shapes: ``B`` batch, ``S`` source length, ``T`` target length, ``D`` model width, ``H`` heads.
Token id conventions are fixed for every task (see :mod:`taskformer.core.tokenize`):
0 = padding, 1 = begin-of-sequence, 2 = end-of-sequence (also the separator of a pair's texts), 3 = unknown.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Protocol, Self, cast

import torch
import torch.nn.functional as F
from torch import nn

from taskformer.core.model_config import ModelConfig
from taskformer.core.tokenize import BOS, EOS, PAD, UNK  # noqa: F401 -- the ids every tokenizer reserves


class Dropout(nn.Module):
    """``nn.Dropout`` with a cheaper random mask on CPU.

    PyTorch's CPU dropout draws every Bernoulli sample from one single-threaded generator; that was a
    quarter of a bf16 training step. Here each 64-bit draw yields four 16-bit uniforms, so ``p`` is
    rounded to a multiple of 1/65536 and the kept values are scaled by that rounded rate (the
    expectation stays exact). Other devices keep PyTorch's fused kernel.
    """

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        cut = min(round(self.p * 65536), 65535)  # 16-bit values below -32768 + cut are dropped
        bits = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-2**63, None)  # full 64-bit range
        keep = bits.view(torch.int16)[: x.numel()].view(x.shape) >= cut - 32768
        return x * (keep.to(x.dtype) * (65536 / (65536 - cut)))

    def extra_repr(self) -> str:
        return f"p={self.p}"


class SinusoidalPositions(nn.Module):
    """Fixed sin/cos position signal (paper section 3.5): no parameters, any offset for cached decoding."""

    pe: torch.Tensor  # (max_len, D), a buffer

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        pos = torch.arange(max_len).unsqueeze(1)
        freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(pos * freq)
        pe[:, 1::2] = torch.cos(pos * freq)
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, x: torch.Tensor, start: int | torch.Tensor = 0) -> torch.Tensor:
        if isinstance(start, torch.Tensor):  # a compiled step's position, a tensor so that it is not a constant
            return x + self.pe.index_select(0, start + torch.arange(x.size(1), device=x.device)).to(x.dtype)
        if start + x.size(1) > self.pe.size(0):
            raise ValueError(f"sequence of {start + x.size(1)} positions exceeds model.max_len={self.pe.size(0)}")
        return x + self.pe[start : start + x.size(1)].to(x.dtype)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over ``H`` heads through PyTorch's fused kernel.

    One ``(3D, D)`` projection holds the query, key and value weights. Self-attention applies it in
    one matmul; cross-attention applies the query rows to the decoder and the key/value rows to the
    encoder memory. With a ``cache`` dict the keys and values of earlier steps are kept, so each
    decoding step only projects the newest position.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.h, self.d = n_heads, d_model
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        # cross-attention's rows of in_proj as modules: see split_cross()
        self.q_proj: nn.Linear | None = None
        self.kv_proj: nn.Linear | None = None
        self.dropout = dropout
        self.keep_weights = False  # set by Transformer.attention_maps() to record softmax weights
        self.weights: torch.Tensor | None = None

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # (B, L, D) -> (B, H, L, D/H)
        return x.unflatten(-1, (self.h, self.d // self.h)).transpose(1, 2)

    @staticmethod
    def _append(cache: dict, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor | None = None):
        """Add the new positions to the cached keys/values; return all of them so far, and the mask of
        the keys each new query sees (``None``: all of them, or the causal mask).

        The cache keeps buffers with room to spare (doubled when full), so a decoding step writes
        one position instead of copying the whole history the way ``torch.cat`` would. With a
        ``start`` position tensor the cache is static, as a compiled step needs: buffers of ``room``
        zeroed slots made once, the new keys/values written from ``start``, and every slot returned
        with the mask of those each query may see (itself and the ones before), so that every step
        has the same shapes.
        """
        if start is not None:
            if "k" not in cache:
                cache["k"], cache["v"] = (x.new_zeros(x.size(0), x.size(1), cache["room"], x.size(3)) for x in (k, v))
            at = start + torch.arange(k.size(2), device=k.device)
            cache["k"].index_copy_(2, at, k)
            cache["v"].index_copy_(2, at, v)
            slots = torch.arange(cache["k"].size(2), device=k.device)
            return cache["k"], cache["v"], slots <= at.unsqueeze(1)
        n, new = cache.get("length", 0), k.size(2)
        if "k" not in cache or n + new > cache["k"].size(2):
            for name, x in (("k", k), ("v", v)):
                grown = x.new_empty(x.size(0), x.size(1), max(2 * (n + new), 16, cache.get("room", 0)), x.size(3))
                if n:
                    grown[:, :, :n] = cache[name][:, :, :n]
                cache[name] = grown
        cache["k"][:, :, n : n + new], cache["v"][:, :, n : n + new] = k, v
        cache["length"] = n + new
        return cache["k"][:, :, : n + new], cache["v"][:, :, : n + new], None

    def split_cross(self) -> None:
        """Give cross-attention's query rows and key/value rows of ``in_proj`` their own ``nn.Linear``
        (copies), for an inference copy of the model: int8 quantization replaces whole modules. The
        saved weights keep the one ``in_proj``."""
        (w_q, w_kv), (b_q, b_kv) = (t.detach().split([self.d, 2 * self.d]) for t in (self.in_proj.weight, self.in_proj.bias))
        self.q_proj, self.kv_proj = nn.Linear(self.d, self.d), nn.Linear(self.d, 2 * self.d)
        with torch.no_grad():
            for lin, w, b in ((self.q_proj, w_q, b_q), (self.kv_proj, w_kv, b_kv)):
                lin.weight.copy_(w)
                lin.bias.copy_(b)

    def _cross_projections(self):
        if self.q_proj is not None:
            return self.q_proj, self.kv_proj
        (w_q, w_kv), (b_q, b_kv) = (t.split([self.d, 2 * self.d]) for t in (self.in_proj.weight, self.in_proj.bias))
        return (lambda x: F.linear(x, w_q, b_q)), (lambda m: F.linear(m, w_kv, b_kv))

    def forward(self, x, memory=None, mask=None, causal=False, cache=None, start=None):
        if memory is None:  # self-attention: q, k, v all from x
            q, k, v = map(self._heads, self.in_proj(x).chunk(3, dim=-1))
            if cache is not None:
                k, v, seen = self._append(cache, k, v, start)
                if seen is not None:  # a static cache: its mask replaces the causal one
                    mask, causal = seen, False
        else:  # cross-attention: keys/values of the memory never change while decoding
            q_proj, kv_proj = self._cross_projections()
            q = self._heads(q_proj(x))
            if cache is not None and "k" in cache:
                k, v = cache["k"], cache["v"]
            else:
                k, v = map(self._heads, kv_proj(memory).chunk(2, dim=-1))
                if cache is not None:  # contiguous once, so that every later step reads them without a copy
                    k, v = cache["k"], cache["v"] = k.contiguous(), v.contiguous()
        single = q.size(-2) == 1
        group = q.size(0) // k.size(0)
        if group > 1:  # beam search: the K hypotheses of a sentence query its keys, held once, together
            q = q.unflatten(0, (-1, group)).transpose(1, 2).flatten(2, 3)  # (B, H, K * T, D/H)
        if self.keep_weights:  # slow path, only for plotting attention
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            self.weights = scores.softmax(-1).mean(1).detach()
        dropout = self.dropout if self.training else 0.0
        if single and dropout == 0.0 and q.device.type == "cpu":
            # One query per row, as in every cached decoding step: two small batched matmuls beat the
            # fused kernel's set-up on CPU (1.8x in fp32, 3.9x in bf16 for 128 x 8 heads x 24 keys).
            # They and the softmax run in fp32, as inside the fused kernel: in bf16 oneDNN would make and
            # keep a kernel of about 0.6 MB for each shape, and the rows and keys change at every step
            # (a server's memory would grow with every batch; fp32 is as fast here).
            with torch.autocast("cpu", enabled=False):
                scores = (q.float() @ k.float().transpose(-2, -1)) * q.size(-1) ** -0.5
                if mask is not None:
                    scores = scores.masked_fill(~mask, float("-inf"))
                out = (scores.softmax(-1) @ v.float()).to(v.dtype)
        elif q.device.type == "cpu" and q.dtype != torch.float32 and torch.is_grad_enabled():
            # Under bf16 autocast the CPU attention kernel's backward is ~10x slower than in fp32;
            # the projections around it keep their bf16 speed. Inference has no backward: it stays bf16.
            with torch.autocast("cpu", enabled=False):
                out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                                     is_causal=causal, dropout_p=dropout).to(q.dtype)
        else:
            if mask is not None and torch.onnx.is_in_onnx_export():
                # Exported (opset 23) as ONNX's Attention, whose CPU kernel in ONNX Runtime takes a mask
                # with a row per query: it does not broadcast our one row of keys as the operator allows.
                mask = mask.expand(-1, -1, q.size(-2), -1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=dropout)
        if group > 1:
            out = out.unflatten(2, (group, -1)).transpose(1, 2).flatten(0, 1)  # back to (B * K, H, T, D/H)
        return self.out_proj(out.transpose(1, 2).flatten(2))


class FeedForward(nn.Sequential):
    """Position-wise two-layer network, ReLU as in the paper."""

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__(nn.Linear(d_model, d_ff), nn.ReLU(), Dropout(dropout), nn.Linear(d_ff, d_model))


class Block(nn.Module):
    """One encoder (self-attention + FFN) or decoder (self-attention + cross-attention + FFN) layer.

    Each sub-layer is wrapped in a residual connection and LayerNorm, either before the sub-layer
    (pre-norm, the default) or after the residual sum (post-norm, the paper's arrangement).
    """

    def __init__(self, cfg: ModelConfig, cross: bool):
        super().__init__()
        d, h = cfg.d_model, cfg.n_heads
        self.self_attn = MultiHeadAttention(d, h, cfg.attn_dropout)
        self.cross_attn = MultiHeadAttention(d, h, cfg.attn_dropout) if cross else None
        self.ff = FeedForward(d, cfg.d_ff, cfg.dropout)
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(3 if cross else 2))
        self.drop = Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def _sublayer(self, x, i, fn):
        if self.norm_first:
            return x + self.drop(fn(self.norms[i](x)))
        return self.norms[i](x + self.drop(fn(x)))

    def forward(self, x, mask=None, memory=None, memory_mask=None, causal=False, cache=None, start=None):
        x = self._sublayer(x, 0, lambda y: self.self_attn(y, mask=mask, causal=causal, start=start,
                                                          cache=None if cache is None else cache["self"]))
        if self.cross_attn is not None:
            x = self._sublayer(x, 1, lambda y: self.cross_attn(y, memory, mask=memory_mask,
                                                               cache=None if cache is None else cache["cross"]))
        return self._sublayer(x, len(self.norms) - 1, self.ff)


class Generator(nn.Module):
    """Projects decoder states to vocabulary logits (weights tied to the embedding when configured)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, h: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.proj(h)


class ClassificationHead(nn.Module):
    """Pools encoder states over real (non-padding) tokens, then a small MLP gives class logits."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pooling = cfg.pooling
        self.mlp = nn.Sequential(Dropout(cfg.dropout), nn.Linear(cfg.d_model, cfg.d_model), nn.Tanh(),
                                 Dropout(cfg.dropout), nn.Linear(cfg.d_model, cfg.num_classes))

    def forward(self, h: torch.Tensor, src_mask: torch.Tensor | None) -> torch.Tensor:
        """Class logits; ``src_mask`` None: every position is a real token (a batch without padding)."""
        if self.pooling == "first":
            return self.mlp(h[:, 0])
        if src_mask is None:
            return self.mlp(h.amax(1) if self.pooling == "max" else h.mean(1))
        keep = src_mask.view(h.size(0), -1, 1)  # (B, S, 1) True for real tokens
        if self.pooling == "max":
            pooled = h.masked_fill(~keep, float("-inf")).amax(1)
        else:
            pooled = (h * keep).sum(1) / keep.sum(1).clamp(min=1)
        return self.mlp(pooled)


class TaggingHead(nn.Module):
    """One label per position: encoder states (B, S, D) to tag logits (B, S, num_classes).

    A linear map per token, as BERT's token classifier: the encoder has already mixed in the context.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.proj = nn.Sequential(Dropout(cfg.dropout), nn.Linear(cfg.d_model, cfg.num_classes))

    def forward(self, h: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.proj(h)


def segment_ids(src: torch.Tensor) -> torch.Tensor:
    """Which text of a pair each position of ``src`` (B, S) belongs to: 0 up to and with the first EOS,
    the separator; 1 after it (the second text and its own EOS). The frame says it, so no batch
    carries segment ids beside the tokens."""
    ends = (src == EOS).long()
    return (ends.cumsum(1) - ends).clamp(max=1)


DEFAULT_HEADS = {"encoder-decoder": Generator, "encoder-only": ClassificationHead, "tagging": TaggingHead,
                 "decoder-only": Generator}


class SequenceModel(Protocol):
    """What training and the searches ask of a network: one :class:`Transformer`, or an :class:`Ensemble`
    of them, which has the same interface with the members' states side by side (its caches too)."""

    cfg: ModelConfig
    training: bool

    def __call__(self, src: torch.Tensor, tgt_in: torch.Tensor | None = None) -> torch.Tensor: ...

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]: ...

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor | None, memory_mask: torch.Tensor | None,
               cache: Any = None, start: int | torch.Tensor = 0) -> torch.Tensor: ...

    def head(self, hidden: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor: ...

    def new_cache(self, steps: int = 0) -> list[Any]: ...

    def reorder_cache(self, cache: Any, index: torch.Tensor, sentences: torch.Tensor | None = None) -> None: ...

    def attention_maps(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor: ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...

    def train(self, mode: bool = True) -> Self: ...

    def eval(self) -> Self: ...


class Transformer(nn.Module):
    """Encoder-decoder, encoder-only (classification, tagging) or decoder-only Transformer with a
    task-supplied head.

    ``forward(src, tgt_in)`` returns logits for training; decoding uses ``encode`` once and then
    ``decode`` a step at a time with a key/value cache (see :mod:`taskformer.core.decoding`). A
    decoder-only model has no encoder: ``encode`` gives no memory, and its decoder reads ``src``.
    """

    def __init__(self, cfg: ModelConfig, head: nn.Module | None = None):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=PAD)
        kind = cfg.kind
        self.tgt_embed: nn.Embedding | None = None
        if kind.shifted and not cfg.tie_embeddings:
            self.tgt_embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=PAD)
        # Sentence pairs (BERT's segment embeddings): a pair is read as one sequence, [BOS] first [EOS]
        # second [EOS], and each token's embedding gains a learned vector for its text, so that every
        # layer can tell the two texts apart, not only by where the separator is. Only a model of pairs
        # has the table: every other model's parameters are as they were.
        self.segments: nn.Embedding | None = nn.Embedding(2, cfg.d_model) if cfg.pairs else None
        self.positions = SinusoidalPositions(cfg.d_model, cfg.max_len)
        self.drop = Dropout(cfg.dropout)
        self.encoder: nn.ModuleList | None = None
        self.decoder: nn.ModuleList | None = None
        if kind.encoder:
            self.encoder = nn.ModuleList(Block(cfg, cross=False) for _ in range(cfg.enc_layers))
            self.enc_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        if kind.decoder:  # cross-attention only where there is an encoder to attend to
            self.decoder = nn.ModuleList(Block(cfg, cross=kind.encoder) for _ in range(cfg.dec_layers))
            self.dec_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.head: nn.Module = head if head is not None else DEFAULT_HEADS[cfg.variant](cfg)
        self._init_weights()
        if cfg.tie_embeddings and isinstance(self.head, Generator):
            self.head.proj.weight = self.embed.weight

    def _init_weights(self) -> None:
        # Xavier for every matrix (as the reference implementation); embeddings get N(0, D^-1/2) so
        # that after the sqrt(D) scaling their entries have unit variance, like the position signal.
        for _name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        for emb in (self.embed, self.tgt_embed):
            if emb is not None:
                nn.init.normal_(emb.weight, std=self.cfg.d_model ** -0.5)
                with torch.no_grad():
                    emb.weight[PAD].zero_()
        if self.segments is not None:  # the scale of a token's embedding; no row is padding here
            nn.init.normal_(self.segments.weight, std=self.cfg.d_model ** -0.5)

    def _embed(self, tokens: torch.Tensor, table: nn.Embedding, start: int | torch.Tensor = 0,
               segments: nn.Embedding | None = None) -> torch.Tensor:
        """Token embeddings (plus, for a pair, the embedding from ``segments`` of each token's text) scaled
        by sqrt(D), with positions."""
        x = table(tokens) if segments is None else table(tokens) + segments(segment_ids(tokens))
        return self.drop(self.positions(x * math.sqrt(self.cfg.d_model), start))

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Encode ``src`` (B, S). Returns the memory (B, S, D) and the key mask (B, 1, 1, S), True = real token.

        A decoder-only model has no memory (``None``): its prompt is the decoder's own prefix."""
        mask = (src != PAD).view(src.size(0), 1, 1, -1)
        return (None if self.encoder is None else self.memory(src, mask)), mask

    def memory(self, src: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The encoder's states (B, S, D) of ``src`` under the key ``mask``; None where the caller
        vouches that no row has padding (a batch of one length: ONNX Runtime's graph, core/onnx_export)."""
        assert self.encoder is not None, "a decoder-only model has no encoder"
        x = self._embed(src, self.embed, segments=self.segments)
        for block in self.encoder:
            x = block(x, mask=mask)
        return self.enc_norm(x)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor | None, memory_mask: torch.Tensor | None,
               cache: list[dict] | None = None, start: int | torch.Tensor = 0) -> torch.Tensor:
        """Decoder states for ``tgt`` (B, T). With a cache, ``tgt`` holds only the new positions from ``start``;
        a tensor ``start`` keeps the cache static (see ``MultiHeadAttention._append``).

        ``memory`` is ``None`` for a decoder-only model (its blocks have no cross-attention)."""
        assert self.decoder is not None, "an encoder-only model has no decoder"
        x = self._embed(tgt, self.embed if self.tgt_embed is None else self.tgt_embed, start)
        # Right padding means a real query never sees a pad key under the causal mask; a single new
        # position attends to everything cached, so it needs no mask at all.
        causal = tgt.size(1) > 1
        static = start if isinstance(start, torch.Tensor) and cache is not None else None
        for i, block in enumerate(self.decoder):
            x = block(x, memory=memory, memory_mask=memory_mask, causal=causal, start=static,
                      cache=None if cache is None else cache[i])
        return self.dec_norm(x)

    def new_cache(self, steps: int = 0) -> list[dict]:
        """An empty key/value cache: one dict per decoder layer (self-attention grows, cross is fixed).

        ``steps``, the longest search, sizes the self-attention buffers once at the first step.
        """
        assert self.decoder is not None, "an encoder-only model has no decoder"
        return [{"self": {"room": steps}, "cross": {}} for _ in self.decoder]

    @staticmethod
    def reorder_cache(cache: list[dict], index: torch.Tensor, sentences: torch.Tensor | None = None) -> None:
        """Keep the self-attention rows ``index`` (the surviving beam hypotheses, or the unfinished rows).

        Cross-attention keys/values are held once per sentence and change only when ``sentences``
        says which sentences are kept: beams move within their own sentence.
        """
        for layer in cache:
            for part, rows in ((layer["self"], index), (layer["cross"], sentences)):
                if rows is not None and "k" in part:
                    part["k"], part["v"] = part["k"].index_select(0, rows), part["v"].index_select(0, rows)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor | None = None) -> torch.Tensor:
        memory, mask = self.encode(src)
        if self.decoder is None:  # encoder-only: the head reads the encoder
            return self.head(memory, mask)
        if self.encoder is None:  # decoder-only: next-token logits at every position of src itself
            return self.head(self.decode(src, None, None), mask)
        assert tgt_in is not None, "an encoder-decoder model reads the target beside its source"
        return self.head(self.decode(tgt_in, memory, mask), mask)

    @torch.no_grad()
    def attention_maps(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Cross-attention weights of the last decoder layer, averaged over heads: (B, T, S)."""
        last = None if self.decoder is None else self.decoder[-1]
        assert isinstance(last, Block) and last.cross_attn is not None, "only an encoder-decoder model cross-attends"
        attn = last.cross_attn
        attn.keep_weights = True
        try:
            self.forward(src, tgt_in)
            assert attn.weights is not None
            return attn.weights
        finally:
            attn.keep_weights, attn.weights = False, None

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


class Ensemble(nn.Module):
    """``members`` independently initialised networks whose log-probabilities are averaged.

    With little data, the errors of separately initialised networks are partly independent, so their
    average beats each of them (AG_News from 4,750 rows, docs/results.md). Each member learns from
    its own loss, as if alone (they share only the batches): in training the output stacks the
    members' logits ``(K, ...)`` as they are (the loss normalises each row itself, so no fp32
    log-softmax copy of K vocabularies is made) and the loss averages over them. Trained on the loss of
    their average instead, the members co-adapt and the ensemble gained nothing over one network.
    In evaluation the output is the mean of the members' log-probabilities, a valid set of logits.

    An encoder-decoder ensemble is searched like one :class:`Transformer`: it has the same decoding
    interface (``encode``, ``decode``, ``head``, ``new_cache``, ``reorder_cache``), with the members'
    states side by side in one extra dimension ``K``. Each member keeps its own key/value cache; at
    every step ``head`` gives the mean of the members' log-probabilities, the log of their geometric
    mean. The search's ``log_softmax`` renormalises that to a distribution, so beam scores sum the
    log of the normalised geometric mean (greedy's argmax is the same either way).
    """

    def __init__(self, members: list[Transformer]):
        super().__init__()
        self.members = nn.ModuleList(members)
        self.cfg = members[0].cfg

    @property
    def nets(self) -> list[Transformer]:
        """The members as the networks they are (``nn.ModuleList`` gives its items as any module)."""
        return cast("list[Transformer]", list(self.members))

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor | None = None) -> torch.Tensor:
        if self.training:
            return torch.stack([m(src, tgt_in) for m in self.nets])
        return torch.stack([torch.log_softmax(m(src, tgt_in).float(), dim=-1) for m in self.nets]).mean(0)

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The members' memories stacked as (B, K, S, D) (sentences first, as the search indexes them) and
        the key mask (B, 1, 1, S), which depends only on ``src``."""
        encoded = [m.encode(src) for m in self.nets]
        memories = [states for states, _ in encoded if states is not None]
        if not memories:  # decoder-only: no memory
            return None, encoded[0][1]
        return torch.stack(memories, dim=1), encoded[0][1]

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor | None, memory_mask: torch.Tensor | None,
               cache: list[list[dict]] | None = None, start: int | torch.Tensor = 0) -> torch.Tensor:
        """Each member's decoder states on its own memory and cache, stacked as (B, T, K, D)."""
        return torch.stack([m.decode(tgt, None if memory is None else memory[:, i], memory_mask,
                                     None if cache is None else cache[i], start)
                            for i, m in enumerate(self.nets)], dim=2)

    def head(self, hidden: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Mean over members of their log-probabilities (B, T, V), each from its own output head."""
        return torch.stack([torch.log_softmax(m.head(hidden[:, :, i], src_mask).float(), dim=-1)
                            for i, m in enumerate(self.nets)]).mean(0)

    def new_cache(self, steps: int = 0) -> list[list[dict]]:
        return [m.new_cache(steps) for m in self.nets]

    @staticmethod
    def reorder_cache(cache: list[list[dict]], index: torch.Tensor, sentences: torch.Tensor | None = None) -> None:
        for member in cache:
            Transformer.reorder_cache(member, index, sentences)

    @torch.no_grad()
    def attention_maps(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """The members' mean cross-attention map (B, T, S): where the ensemble as a whole looked."""
        return torch.stack([m.attention_maps(src, tgt_in) for m in self.nets]).mean(0)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
