"""The model variants, defined once: what each kind of model is, for everyone who must know.

A task names its variant (``Task.variant``, copied into ``model.variant``); the model, the data
encoding, the loss, the default decoder, the runner's checks and the export ask :func:`of` what it
means instead of comparing names. A new variant (a decoder-only language model, say) starts here.

======================  =====================  ======================  ======================
                        ``encoder-decoder``    ``encoder-only``        ``tagging``
======================  =====================  ======================  ======================
a target in TaskData    text                   one of ``labels``       one of ``labels`` per
                                                                       source word
source frame            ``ids + [EOS]``        ``[BOS] + ids``         ``[BOS] + ids``
batch target            ``(B, T)`` token ids,  ``(B,)`` class ids      ``(B, S)`` tag ids at
                        shifted for teacher                            each word's first
                        forcing                                        token, ``IGNORE`` else
head logits             ``(B, T, vocab)``      ``(B, classes)``        ``(B, S, classes)``
default decoding        search                 arg-max label           arg-max tag per word
                        (``decode.strategy``)
CTranslate2 export      yes                    no                      no
======================  =====================  ======================  ======================
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """One kind of model. Everything else about it follows from whether it has a decoder and, if
    not, whether it labels each word or the whole input."""

    name: str
    decoder: bool  # a decoder writes the output token by token: targets are text, outputs are searched
    per_word: bool = False  # no decoder: one label per source word (a tagger) instead of one per input

    @property
    def labelled(self) -> bool:
        """Targets are names from ``TaskData.labels`` (classes or tags) rather than text."""
        return not self.decoder

    @property
    def classifies(self) -> bool:
        """One label per input: a classifier, whose prediction is a ``Label(label, probability)``."""
        return self.labelled and not self.per_word

    @property
    def exportable(self) -> bool:
        """CTranslate2 can run it: its Transformer spec is an encoder-decoder ending in a vocabulary
        projection, with its own greedy and beam search (docs/export.md)."""
        return self.decoder

    def logits_shape(self, batch: int, src_len: int, tgt_len: int, vocab_size: int, num_classes: int) -> tuple:
        """The shape a head must give for a batch: what the loss scores against the batch's targets."""
        if self.decoder:
            return (batch, tgt_len, vocab_size)
        return (batch, src_len, num_classes) if self.per_word else (batch, num_classes)


_ALL = (Variant("encoder-decoder", decoder=True), Variant("encoder-only", decoder=False),
        Variant("tagging", decoder=False, per_word=True))
VARIANTS = tuple(v.name for v in _ALL)  # the names ``model.variant`` and ``Task.variant`` accept


def of(name: str) -> Variant:
    """The variant called ``name`` (one of :data:`VARIANTS`)."""
    try:
        return next(v for v in _ALL if v.name == name)
    except StopIteration:
        raise ValueError(f"model.variant must be one of {', '.join(VARIANTS)}, not {name!r}") from None
