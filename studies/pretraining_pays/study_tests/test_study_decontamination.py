"""The second protocol's decontamination (evidence_protocol.md, section 1): the normalisation, the three rules, what a
match removes, and the audit's known cases on the real data (the protocol requires them before any corpus is built)."""
from __future__ import annotations

import json
from collections import Counter

import pytest

pytestmark = pytest.mark.usefixtures("study_importable")

REVIEW = ("this film is a quiet wonder from the first frame to the last and i would watch it again tomorrow with "
          "my whole family and every one of my friends because it never once talks down to its audience")


def test_both_sides_normalise_alike():
    from study_decontamination import normalised_words

    assert normalised_words("It does n't work -LRB- really -RRB- .") == ("it", "doesnt", "work", "really")
    assert normalised_words("It doesn't work (really).") == ("it", "doesnt", "work", "really")
    assert normalised_words("It doesn’t work<br /><br />really") == ("it", "doesnt", "work", "really")
    assert normalised_words("Caf&eacute; <i>NOIR</i>, it 's") == ("café", "noir", "its")


def test_exact_near_and_contained_matches():
    from study_decontamination import EvaluationIndex, normalised_words

    texts = EvaluationIndex({"imdb_test": [REVIEW.replace(" ", "<br /> ", 3)],
                             "sst2_dev": ["It does n't hold up to the hype .", "good"]})
    assert texts.counts()["sst2_dev"] == {"texts": 2, "under_6_words_not_checked": 1}
    exact = texts.matches(normalised_words(REVIEW))
    assert {(m.rule, m.eval_set) for m in exact} == {("exact", "imdb_test"), ("near", "imdb_test")}
    words = normalised_words("Some preamble here. " + " ".join(REVIEW.split()[3:31]) + " and then something else")
    near = texts.matches(words)
    assert [(m.rule, m.start, m.end) for m in near] == [("near", 3, 28)]
    assert texts.matches(normalised_words(" ".join(REVIEW.split()[3:27]))) == []   # a run of 24 is not near
    contained = texts.matches(normalised_words("My verdict: it doesn't hold up to the hype, sadly. It is good."))
    assert [(m.rule, m.eval_set, m.eval_index, m.start, m.end) for m in contained] == [
        ("contained", "sst2_dev", 0, 2, 9)]


def test_a_match_removes_the_paragraphs_it_touches_and_only_those():
    from study_decontamination import EvaluationIndex, clean_paragraphs

    texts = EvaluationIndex({"imdb_test": [REVIEW]})
    half = REVIEW.split()
    paragraphs = ["An unrelated opening paragraph.", " ".join(half[:15]), " ".join(half[15:30]), "A closing one."]
    kept, found = clean_paragraphs(texts, paragraphs)   # the 25-word run crosses the break between 2 and 3
    assert kept == ["An unrelated opening paragraph.", "A closing one."]
    assert [m.rule for m in found] == ["near"]
    assert clean_paragraphs(texts, ["Nothing to see.", "Still nothing."]) == (["Nothing to see.", "Still nothing."],
                                                                               [])


@pytest.fixture(scope="module")
def audit(shared_data, tmp_path_factory):
    from study_corpora import domain_documents
    from study_data import StudyData
    from study_decontamination import EvaluationIndex, evaluation_sets, normalised_words
    from study_record import RECORD
    from study_sensitivity import scored_overlaps

    texts = EvaluationIndex({"imdb_test": evaluation_sets(shared_data)["imdb_test"]})
    dropped = {item["document"] for item in
               json.loads((RECORD / "corpora" / "domain" / "stats.json").read_text())["dropped"]}
    in_pool, in_first = set(), set()
    for identity, paragraphs in domain_documents(shared_data / "corpora", Counter(), quick=False):
        for match in texts.matches(normalised_words("\n\n".join(paragraphs))):
            if match.rule == "exact":
                in_pool.add(texts.words[match.eval_index])
                if identity not in dropped:
                    in_first.add(texts.words[match.eval_index])
    data = StudyData(shared_data, tmp_path_factory.mktemp("study_data"))
    return {"in_pool": in_pool, "in_first": in_first, "scored": scored_overlaps(shared_data, RECORD, data)}


@pytest.mark.slow
def test_the_audits_known_cases_on_the_real_data(audit):
    """evidence_protocol.md, section 1 and its first amendment: 389 distinct IMDB test texts equal a review of the
    domain pool, 227 of them stayed in the first corpus (the first check caught 162), 49 of the scored 5,000 among
    them; 57 scored reviews match the first corpus, 91 the pool."""
    assert len(audit["in_pool"]) == 389
    assert len(audit["in_first"]) == 227
    scored = audit["scored"]
    assert scored["pool_documents"] - scored["first_corpus_documents"] == 200   # what the first check dropped
    assert scored["first_corpus"]["by_rule"]["exact"] == 49
    assert scored["first_corpus"]["reviews"] == 57
    assert scored["pool"]["reviews"] == 91


def test_the_sensitivity_scores_a_runs_predictions_without_the_left_out_rows(tmp_path):
    from study_sensitivity import accuracy

    predictions = tmp_path / "dev.tsv"
    predictions.write_text("idx\tprediction\tlabel\n0\t1\t1\n1\t0\t1\n2\t1\t1\n3\t0\t0\n")
    assert accuracy(predictions, set()) == (0.75, 4)
    assert accuracy(predictions, {1}) == (1.0, 3)
