"""The model variants, defined once: what each kind of model is, for everyone who must know.

A task names its variant (``Task.variant``, copied into ``model.variant``); the model, the data
encoding, the loss, the default decoder, the runner's checks and the export ask :func:`of` what it
means instead of comparing names. A new variant starts here.

==================  =====================  ==================  ==================  =========================
                    ``encoder-decoder``    ``encoder-only``    ``tagging``         ``decoder-only``
==================  =====================  ==================  ==================  =========================
a row in TaskData   (source, text)         (text, one of       (text, one of       (prompt, text): the prompt
                                           ``labels``)         ``labels`` per      is read, never scored
                                                               word)
source frame        ``ids + [EOS]``        ``[BOS] + ids``     ``[BOS] + ids``     ``ids`` (the prompt)
batch               source ``(B, S)``,     ``(B, S)``,         ``(B, S)``, tag     a block ``(B, L)`` of
                    target ``(B, T)``      class ids ``(B,)``  ids at each word's  prompt + text, the next
                    shifted for teacher                        first token,        token at each position
                    forcing                                    ``IGNORE`` else     (``IGNORE`` in the prompt)
head logits         ``(B, T, vocab)``      ``(B, classes)``    ``(B, S, classes)`` ``(B, L, vocab)``
default decoding    search                 arg-max label       arg-max tag         search continues the
                    (``decode.strategy``)                      per word            prompt
CTranslate2 export  yes                    no                  no                  yes (a generator)
==================  =====================  ==================  ==================  =========================

An encoder-only task may read pairs of texts (``Task(pairs=True)``, ``model.pairs``): its row is
``((first, second), label)``, its source frame ``[BOS] + first + [EOS] + second + [EOS]``.
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
    encoder: bool = True  # False: no encoder, the decoder reads the source as its own prefix (a language model)

    @property
    def shifted(self) -> bool:
        """The target is read shifted by one (teacher forcing), beside the source: an encoder-decoder's.
        A decoder-only batch holds its next tokens already aligned with its inputs."""
        return self.decoder and self.encoder

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
        """CTranslate2 can run it: its Transformer specs end in a vocabulary projection, with its own
        search: an encoder-decoder (a ``Translator``) or a decoder alone (a ``Generator``; docs/export.md)."""
        return self.decoder

    def logits_shape(self, batch: int, src_len: int, tgt_len: int, vocab_size: int, num_classes: int) -> tuple:
        """The shape a head must give for a batch: what the loss scores against the batch's targets."""
        if self.decoder:
            return (batch, tgt_len if self.encoder else src_len, vocab_size)
        return (batch, src_len, num_classes) if self.per_word else (batch, num_classes)


_ALL = (Variant("encoder-decoder", decoder=True), Variant("encoder-only", decoder=False),
        Variant("tagging", decoder=False, per_word=True), Variant("decoder-only", decoder=True, encoder=False))
VARIANTS = tuple(v.name for v in _ALL)  # the names ``model.variant`` and ``Task.variant`` accept


def of(name: str) -> Variant:
    """The variant called ``name`` (one of :data:`VARIANTS`)."""
    try:
        return next(v for v in _ALL if v.name == name)
    except StopIteration:
        raise ValueError(f"model.variant must be one of {', '.join(VARIANTS)}, not {name!r}") from None
