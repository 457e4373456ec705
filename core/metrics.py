"""Scores every task may share: corpus BLEU and chrF of generated text (sacreBLEU), ROUGE of
summary-like outputs (Google's rouge-score), entity-level (span) precision, recall and F1 of
BIO-tagged sequences, and a language model's perplexity and bits."""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable


def translation_metrics(hypotheses: list[str], references: list[str], tokenize: str = "13a") -> dict[str, float]:
    """Corpus BLEU and chrF of detokenized hypotheses against one reference each.

    ``tokenize`` is sacreBLEU's tokenizer for BLEU: ``13a`` (its default) for English and other
    languages written with spaces, ``zh`` for Chinese, which splits every Chinese character apart
    (an unsegmented Chinese sentence would otherwise be one long "word"). chrF reads characters and
    needs no tokenizer.
    """
    import sacrebleu  # here: the tagging metrics below need none of it

    refs = [references]
    return {"bleu": sacrebleu.corpus_bleu(hypotheses, refs, tokenize=tokenize).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, refs).score}


def rouge_scores(hypotheses: list[str], references: list[str], stem: bool = True,
                 words: Callable[[str], list[str]] | None = None) -> dict[str, float]:
    """ROUGE-1, ROUGE-2 and ROUGE-L F-measures (percent), each the mean over hypotheses of its score
    against its one reference: what summarization papers report (Lin, 2004), computed by the
    rouge-score package that reproduces the original Perl script.

    Its tokenizer lower-cases and keeps only the letters a-z and digits (English), with Porter
    stemming where ``stem``; for other languages give ``words``, a function from a text to its
    tokens (``str.split`` for a language written with spaces; its tokens are not stemmed).
    """
    from rouge_score import rouge_scorer  # here: the other metrics need none of it

    if len(hypotheses) != len(references):
        raise ValueError(f"rouge_scores: {len(hypotheses)} hypotheses for {len(references)} references")
    if not hypotheses:
        return {}
    names = ("rouge1", "rouge2", "rougeL")
    scorer = rouge_scorer.RougeScorer(list(names), use_stemmer=stem,
                                      tokenizer=None if words is None else _Words(words))
    scores = [scorer.score(ref, hyp) for hyp, ref in zip(hypotheses, references)]  # score(target, prediction)
    return {name: 100.0 * sum(s[name].fmeasure for s in scores) / len(scores) for name in names}


class _Words:
    """A function from text to tokens, as rouge-score's ``tokenizer`` argument takes one (``.tokenize``)."""

    def __init__(self, words: Callable[[str], list[str]]):
        self.tokenize = words


def language_model_scores(references: list[str], logprobs: list[list[float]]) -> dict[str, float]:
    """How well a language model predicts ``references`` from the log-probabilities (nats) of their
    tokens: ``perplexity`` (exp of the mean loss per token), ``bits_per_token`` and ``bits_per_char``
    (all the bits over the references' characters: comparable across tokenizers, e.g. characters
    against BPE)."""
    nats, tokens = -sum(map(sum, logprobs)), sum(map(len, logprobs))
    if not tokens:
        return {}
    chars = sum(map(len, references))
    return {"perplexity": math.exp(min(nats / tokens, 700.0)), "bits_per_token": nats / tokens / math.log(2),
            "bits_per_char": nats / max(chars, 1) / math.log(2)}


BIO = re.compile(r"O|[BIES]-.+")  # the tags of BIO (IOB1, IOB2) and IOBES schemes: O, or a prefix and a type


def spans(tags: list[str]) -> set[tuple[str, int, int]]:
    """The entities ``(type, first, last)`` of one sentence's BIO, IOB or IOBES tags, by the CoNLL
    script's rules, which seqeval's default mode follows: an entity starts at ``B-`` or ``S-``, at
    ``I-``/``E-`` after ``O``, after an ended entity or after another type (so ``I-PER I-PER`` is one
    person), and ends before ``B-``, ``S-``, ``O`` or another type, or at ``E-``/``S-``.
    """
    found, start, kind, prev = set(), -1, "", "O"
    for i, tag in enumerate([*tags, "O"]):  # a final O closes an entity still open
        prefix, typ = (tag, "") if tag == "O" else (tag[0], tag[2:])
        ends = start >= 0 and (prefix in "BSO" or prev in "ES" or typ != kind)
        if ends:
            found.add((kind, start, i - 1))
            start = -1
        if prefix in "BS" or (prefix in "IE" and start < 0):
            start, kind = i, typ
        prev = prefix
    return found


def span_scores(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """Entity-level precision, recall and F1 (percent, micro-averaged) of tag lines ``"B-PER I-PER O
    ..."``, one per sentence: an entity counts as right only if its type and both ends match, as in
    seqeval and the CoNLL-2003 evaluation. Also ``span_f1_TYPE`` for each entity type of the references.
    """
    right, guessed, true = Counter[str](), Counter[str](), Counter[str]()
    for hyp, ref in zip(hypotheses, references):
        h, r = spans(hyp.split()), spans(ref.split())
        right.update(kind for kind, *_ in h & r)
        guessed.update(kind for kind, *_ in h)
        true.update(kind for kind, *_ in r)

    def f1(p: float, r: float) -> float:
        return 2 * p * r / (p + r) if p + r else 0.0

    def ratio(n: int, d: int) -> float:
        return 100.0 * n / d if d else 0.0

    precision, recall = ratio(sum(right.values()), sum(guessed.values())), ratio(sum(right.values()), sum(true.values()))
    scores = {"span_precision": precision, "span_recall": recall, "span_f1": f1(precision, recall)}
    for kind in sorted(true):
        scores[f"span_f1_{kind}"] = f1(ratio(right[kind], guessed[kind]), ratio(right[kind], true[kind]))
    return scores


def is_bio(lines: list[str]) -> bool:
    """Whether every tag of these tag lines belongs to a BIO, IOB or IOBES scheme (and one is not O)."""
    tags = {tag for line in lines for tag in line.split()}
    return tags != {"O"} and bool(tags) and all(BIO.fullmatch(tag) for tag in tags)
