"""SQuAD v1.1 exact match and F1 (pipeline.finetuning.tasks.squad.evaluate) on hand-written cases: each normalisation
step of the official evaluate-v1.1.py, the maximum over several gold answers, a question without a prediction, the
arithmetic of token F1, and the percentages the official script prints."""
from __future__ import annotations

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import datasets  # noqa: E402
import pytest  # noqa: E402

from pipeline.finetuning.tasks.squad.evaluate import (  # noqa: E402
    exact_match_score,
    f1_score,
    gold_answers,
    normalize_answer,
    squad_v1_metrics,
)

# -- normalisation, one step at a time ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, normalized", [
    ("Denver Broncos", "denver broncos"),                       # lower case
    ("DENVER", "denver"),
    ("Denver's Broncos!", "denvers broncos"),                   # ASCII punctuation removed, not replaced by a space
    ("U.S.A.", "usa"),
    ("24-10", "2410"),                                          # the ASCII hyphen is punctuation
    ("24\u201310", "24\u201310"),                               # an en dash is not (string.punctuation is ASCII)
    ("\u201cquoted\u201d", "\u201cquoted\u201d"),               # nor are curly quotes
    ("the Broncos", "broncos"),                                 # articles removed
    ("a golden statue of the Virgin Mary", "golden statue of virgin mary"),
    ("An apple", "apple"),                                      # after lower-casing, so "An" goes too
    ("theory another anthem", "theory another anthem"),         # whole words only
    ("the-end", "theend"),                                      # punctuation goes first: "theend" is no article
    ("rock and/the roll", "rock andthe roll"),
    ("  Denver \t\n Broncos  ", "denver broncos"),              # whitespace collapsed and stripped
    ("the", ""),
    ("", ""),
])
def test_normalize_answer(text, normalized):
    assert normalize_answer(text) == normalized


def test_exact_match_uses_the_normalisation():
    assert exact_match_score("The Denver Broncos.", "denver broncos")
    assert exact_match_score("a", "the")                        # both normalise to ""
    assert not exact_match_score("Denver", "Denver Broncos")
    assert not exact_match_score("24\u201310", "24-10")


def test_f1_arithmetic():
    # pred [denver, broncos, team] vs gold [denver, broncos]: 2 shared; P = 2/3, R = 1, F1 = 2*(2/3)/(5/3) = 0.8
    assert f1_score("the Denver Broncos team", "Denver Broncos") == pytest.approx(0.8)
    # pred [a, a, b] (no articles here: "x") -> [x, x, y] vs gold [x, y, y]: common = min counts: x 1, y 1 = 2;
    # P = 2/3, R = 2/3, F1 = 2/3
    assert f1_score("x x y", "x y y") == pytest.approx(2 / 3)
    assert f1_score("Carolina Panthers", "Denver Broncos") == 0
    assert f1_score("", "Denver") == 0
    assert f1_score("a", "the") == 0        # EM 1 but F1 0: the official script's quirk on empty normalisations
    assert f1_score("Denver Broncos", "Denver Broncos") == 1.0


def test_metrics_max_over_gold_answers_and_missing_predictions():
    gold = {
        "q1": ["Denver Broncos", "the Broncos", "Broncos"],     # EM via the second answer after normalisation
        "q2": ["Saint Bernadette Soubirous", "Bernadette"],     # F1 0.8 (below)
        "q3": ["1858"],                                         # no prediction: 0 and 0
        "q4": ["golden statue", "a golden statue of the Virgin Mary"],
    }
    predictions = {
        "q1": "broncos!",
        "q2": "Bernadette Soubirous",        # vs answer 1: P 2/2, R 2/3 -> 0.8 (the max); vs answer 2: 2/3
        "q4": "statue",                      # vs answer 1: P 1, R 1/2 -> 2/3; vs answer 2 [golden statue of virgin
                                             #   mary]: P 1, R 1/5 -> 1/3; max 2/3
        "unknown": "ignored",                # predictions for other ids are ignored
    }
    metrics = squad_v1_metrics(gold, predictions)
    assert metrics["exact_match"] == pytest.approx(100 * 1 / 4)
    assert metrics["f1"] == pytest.approx(100 * (1 + 0.8 + 0 + 2 / 3) / 4)
    assert set(metrics) == {"exact_match", "f1"}


def test_metrics_all_right_and_all_missing():
    gold = {"a": ["x"], "b": ["y z"]}
    assert squad_v1_metrics(gold, {"a": "X", "b": "the y, z"}) == {"exact_match": 100.0, "f1": 100.0}
    assert squad_v1_metrics(gold, {}) == {"exact_match": 0.0, "f1": 0.0}


def test_metrics_from_a_dataset_of_examples():
    examples = datasets.Dataset.from_dict({
        "id": ["q1", "q2"], "context": ["c", "c"], "question": ["?", "?"], "title": ["t", "t"],
        "answers": [{"text": ["Denver Broncos", "Broncos"], "answer_start": [0, 7]},
                    {"text": ["1858"], "answer_start": [3]}]})
    assert gold_answers(examples) == {"q1": ["Denver Broncos", "Broncos"], "q2": ["1858"]}
    assert squad_v1_metrics(examples, {"q1": "the broncos", "q2": "in 1858"}) == pytest.approx(
        {"exact_match": 50.0, "f1": 100 * (1 + 2 / 3) / 2})


def test_a_question_without_gold_answers_is_an_error():
    with pytest.raises(ValueError, match="question q2 has no gold answer"):
        squad_v1_metrics({"q1": ["x"], "q2": []}, {"q1": "x"})
    with pytest.raises(ValueError, match="no questions"):
        squad_v1_metrics({}, {})
