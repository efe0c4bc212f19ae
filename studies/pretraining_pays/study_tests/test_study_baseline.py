"""study_baseline.py: the bag-of-words regression and the cut of IMDB reviews to their first 128 words."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def baseline(study_importable):
    import study_baseline
    return study_baseline


def test_imdb_reviews_are_cut_to_their_first_words(baseline):
    review = "A " + " ".join(f"w{i}" for i in range(300)) + " The END"
    words = baseline.first_words(review).split()
    assert len(words) == 128 and words[0] == "w0" and words[-1] == "w127"   # "A" is no token of CountVectorizer's


def test_bigrams_decide_what_unigrams_cannot(baseline):
    # every word occurs equally often in both classes: only the word order (bigrams) tells them apart
    positive = ["not bad but good", "good not bad", "not bad good"] * 4
    negative = ["not good but bad", "bad not good", "not good bad"] * 4
    train = (positive + negative, [1] * len(positive) + [0] * len(negative))
    scored = (["not bad", "not good"], [1, 0])
    assert baseline.bag_of_words_accuracy(train, scored, c=10.0, seed=1) == 1.0
