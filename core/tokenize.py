"""Tokenizers for every task, built on Hugging Face ``tokenizers``.

Every tokenizer reserves the same four ids (``PAD``, ``BOS``, ``EOS``, ``UNK``), so the core can
pad, start and stop sequences without knowing which task it serves. Each tokenizer is a single
``tokenizer.json`` in the run directory, reloaded for ``eval`` and ``predict``.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from taskformer.core.progress import track

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ["[PAD]", "[BOS]", "[EOS]", "[UNK]"]  # their tokens, ids 0..3

# CJK radicals, symbols and punctuation, ideographs, compatibility forms and full-width forms.
CJK = r"[\u2e80-\u2fdf\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef]"


def subword(texts: Iterable[str], vocab_size: int, kind: str = "bpe", min_frequency: int = 2,
            normalization: str = "NFKC", isolate: str | None = None) -> Tokenizer:
    """Train a BPE, Unigram or WordPiece tokenizer on ``texts``.

    - ``texts``: the training text, e.g. the sources and targets of the train split (never val or
      test); any iterable of strings, read once.
    - ``vocab_size``: the vocabulary to learn, the four special tokens included.
    - ``kind``: ``"bpe"``, ``"unigram"`` or ``"wordpiece"``.
    - ``min_frequency``: pieces seen fewer times are not merged into tokens (BPE, WordPiece).
    - ``normalization``: ``"NFKC"`` folds compatibility forms (full-width letters, ligatures);
      ``"NFC"`` keeps what NFKC would fold, such as Chinese full-width punctuation (，？！), which
      references keep.
    - ``isolate``: a regular expression matching single characters (``CJK``) that become tokens of
      their own, so one vocabulary holds English subwords and Chinese characters; no word-start
      marker is then added, since Chinese has no spaces to restore.

    The Metaspace pre-tokenizer marks word starts inside the tokens (``\u2581``), so ``decode``
    gives back natural, detokenized text (what sacreBLEU must score), whatever the language.
    """
    trainer: trainers.Trainer
    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIALS,
                                      show_progress=False)
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, unk_token="[UNK]",
                                          show_progress=False)
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=SPECIALS, show_progress=False)
    else:
        raise ValueError(f"tokenizer kind must be bpe, unigram or wordpiece, not {kind!r}")
    if normalization not in ("NFKC", "NFC"):
        raise ValueError(f"normalization must be NFKC or NFC, not {normalization!r}")
    tok.normalizer = normalizers.NFKC() if normalization == "NFKC" else normalizers.NFC()
    if isolate is None:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(isolate), behavior="isolated"),
                                                     pre_tokenizers.Metaspace(prepend_scheme="never")])
        tok.decoder = decoders.Metaspace(prepend_scheme="never")
    tok.train_from_iterator(track(texts, "training the tokenizer"), trainer=trainer)
    return tok


def characters(texts: Iterable[str], min_frequency: int = 1, whitespace: bool = False) -> Tokenizer:
    """One token per character of ``texts``; characters seen fewer than ``min_frequency`` times
    become ``[UNK]``. By default the text is NFKC-normalized and whitespace is ignored, none put back
    on decode (Chinese, couplets). ``whitespace=True`` keeps every character as written, spaces and
    line breaks included, so ``decode`` gives the text back: running text for a language model."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    if not whitespace:
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), "")])
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]" if whitespace else "."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIALS, min_frequency=min_frequency, show_progress=False)
    tok.train_from_iterator(track(pieces(texts), "building the character vocabulary"), trainer=trainer)
    return tok


def pieces(texts: Iterable[str], size: int = 1 << 16) -> Iterator[str]:
    """``texts`` cut into pieces of at most ``size`` characters: a character vocabulary counts them
    the same, and the trainer holds one piece at a time instead of a whole corpus given as one
    string (about 270 bytes a character)."""
    for text in texts:
        for start in range(0, len(text), size):
            yield text[start : start + size]


def symbols(names: list[str]) -> Tokenizer:
    """A fixed vocabulary: each of ``names`` is one token, in the input separated by whitespace
    (digits, tags, any closed set); anything else is ``[UNK]``. Nothing is trained."""
    vocab = {s: i for i, s in enumerate(SPECIALS + list(names))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIALS)  # already in the vocabulary: this marks them so decode skips them
    return tok


def check_specials(tok: Tokenizer) -> None:
    """Tokenizers from plugins must reserve ids 0..3 like the built-in ones."""
    for i, name in enumerate(SPECIALS):
        if tok.token_to_id(name) != i:
            raise ValueError(f"tokenizer must map {name} to id {i} (got {tok.token_to_id(name)})")
