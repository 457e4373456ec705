"""The ``model`` section of the run configuration: the network's hyper-parameters.

Torch-free, like every section, so that building and checking a configuration (and listing its
options) imports no network code; :mod:`taskformer.core.model` builds the network from it.
"""
from __future__ import annotations

from dataclasses import dataclass

from taskformer.core import variants
from taskformer.core.options import check, option
from taskformer.core.variants import VARIANTS


@dataclass
class ModelConfig:
    """Hyper-parameters of the network; ``vocab_size``/``num_classes`` (classes or tags) are filled in from the data."""

    variant: str = option("encoder-decoder", "The network; set by the task, not by --set.", choices=VARIANTS)
    vocab_size: int = option(0, "Token vocabulary size; filled in from the task's tokenizer.", at_least=0)
    num_classes: int = option(0, "Classes or tags; filled in from the task's labels.", at_least=0)
    d_model: int = option(256, "Width of every layer (the embedding size).", above=0)
    n_heads: int = option(8, "Attention heads per layer; must divide d_model.", above=0)
    enc_layers: int = option(3, "Encoder layers.", above=0,
                             variants=tuple(v for v in VARIANTS if variants.of(v).encoder))
    dec_layers: int = option(3, "Decoder layers (a decoder-only model's only stack).", at_least=0,
                             variants=tuple(v for v in VARIANTS if variants.of(v).decoder))
    d_ff: int = option(1024, "Inner width of each feed-forward block.", above=0)
    dropout: float = option(0.1, "Dropout on embeddings, sub-layer outputs and heads.", at_least=0.0, below=1.0)
    attn_dropout: float = option(0.0, "Dropout on attention weights.", at_least=0.0, below=1.0)
    max_len: int = option(256, "Longest sequence in tokens, with begin and end; longer inputs are cut.", at_least=3)
    norm_first: bool = option(True, "Pre-norm (trains stably without a long warm-up); false: the paper's post-norm.")
    tie_embeddings: bool = option(True, "Source, target and output projection share one matrix (joint vocabulary); "
                                  "a decoder-only model's input embedding and output projection.")
    pooling: str = option("mean", "How an encoder-only head pools the encoder states: over real tokens, the "
                          "first token, or the maximum.", choices=("mean", "first", "max"), variants=("encoder-only",))
    pairs: bool = option(False, "Each input is a pair of texts, read as [BOS] first [EOS] second [EOS] with a "
                         "learned embedding per text; set by the task (Task.pairs), not by --set.",
                         variants=("encoder-only",))
    members: int = option(1, "Networks trained as one ensemble whose log-probabilities are averaged (at every "
                          "search step for an encoder-decoder).", at_least=1)

    def validate(self) -> None:
        """Reject impossible combinations (raises ValueError); each field's own range is in its metadata."""
        check("model", self)
        if self.kind.decoder and self.dec_layers <= 0:
            raise ValueError(f"model.dec_layers must be positive, got {self.dec_layers}")
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})")
        if self.d_model % 2:
            raise ValueError(f"model.d_model must be even for sinusoidal positions, got {self.d_model}")
        if self.pairs and not self.kind.classifies:
            raise ValueError(f"model.pairs is for encoder-only models (a class per pair of texts), not {self.variant}")

    @property
    def kind(self) -> variants.Variant:
        """What ``variant`` means (see :mod:`taskformer.core.variants`)."""
        return variants.of(self.variant)
