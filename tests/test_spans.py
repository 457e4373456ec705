"""Span (entity-level) scores of BIO tags, by the CoNLL rules that seqeval's default mode follows.

seqeval itself needs scikit-learn, so the cases are computed by hand here from those rules."""
import pytest

from taskformer import span_scores
from taskformer.core.metrics import is_bio, spans


@pytest.mark.parametrize("tags, expected", [
    ("B-PER I-PER O B-LOC", {("PER", 0, 1), ("LOC", 3, 3)}),
    ("I-PER I-PER O", {("PER", 0, 1)}),  # IOB1: I- after O starts an entity
    ("B-PER I-LOC", {("PER", 0, 0), ("LOC", 1, 1)}),  # another type starts another entity
    ("B-PER B-PER", {("PER", 0, 0), ("PER", 1, 1)}),
    ("S-PER B-LOC E-LOC I-LOC", {("PER", 0, 0), ("LOC", 1, 2), ("LOC", 3, 3)}),  # IOBES: E- and S- end one
    ("O I-MISC E-MISC", {("MISC", 1, 2)}),
    ("O O", set()),
    ("B-ORG I-ORG I-ORG", {("ORG", 0, 2)}),  # an entity open at the end is closed there
])
def test_entities_follow_the_conll_rules(tags, expected):
    assert spans(tags.split()) == expected


def test_span_scores_count_an_entity_only_when_type_and_both_ends_match():
    references = ["B-PER I-PER O B-LOC", "B-ORG O O", "O O"]
    hypotheses = ["B-PER O O B-LOC",  # PER too short (wrong), LOC right
                  "B-ORG O B-PER",  # ORG right, PER spurious
                  "O O"]
    scores = span_scores(hypotheses, references)
    # 4 guessed, 3 true, 2 right: precision 2/4, recall 2/3, F1 2 * .5 * .6667 / 1.1667 = 4/7
    assert scores["span_precision"] == pytest.approx(50.0)
    assert scores["span_recall"] == pytest.approx(200 / 3)
    assert scores["span_f1"] == pytest.approx(400 / 7)
    # per type: LOC 1/1 right; ORG 1/1; PER 0 right of 2 guessed and 1 true
    assert (scores["span_f1_LOC"], scores["span_f1_ORG"], scores["span_f1_PER"]) == (100.0, 100.0, 0.0)


def test_no_entity_guessed_scores_zero_not_a_division_error():
    assert span_scores(["O O"], ["B-PER O"]) == {"span_precision": 0.0, "span_recall": 0.0, "span_f1": 0.0,
                                                 "span_f1_PER": 0.0}


def test_only_bio_tag_sets_are_recognized():
    assert is_bio(["B-PER I-PER O", "O B-LOC"]) and is_bio(["S-X E-Y"])
    assert not is_bio(["title lower upper"]) and not is_bio(["O O"]) and not is_bio([])
