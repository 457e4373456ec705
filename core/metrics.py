"""Corpus scores for generated text, with sacreBLEU: one implementation for every task that translates."""
from __future__ import annotations

import sacrebleu


def translation_metrics(hypotheses: list[str], references: list[str], tokenize: str = "13a") -> dict[str, float]:
    """Corpus BLEU and chrF of detokenized hypotheses against one reference each.

    ``tokenize`` is sacreBLEU's tokenizer for BLEU: ``13a`` (its default) for English and other
    languages written with spaces, ``zh`` for Chinese, which splits every Chinese character apart
    (an unsegmented Chinese sentence would otherwise be one long "word"). chrF reads characters and
    needs no tokenizer.
    """
    refs = [references]
    return {"bleu": sacrebleu.corpus_bleu(hypotheses, refs, tokenize=tokenize).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, refs).score}
