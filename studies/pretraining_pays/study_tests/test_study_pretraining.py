"""The study's first half (study_corpora.py, study_recipe.py): the held-out split, decontamination, and the
protocol's selection rule applied mechanically."""
from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def corpora(study_importable):
    import study_corpora
    return study_corpora


@pytest.fixture(scope="module")
def recipe(study_importable):
    import study_recipe
    return study_recipe


def test_the_split_is_a_function_of_the_identity_one_in_fifty(corpora):
    identities = [f"wiki:Article {i}" for i in range(20000)]
    held = [i for i in identities if corpora.is_held_out(i)]
    assert held == [i for i in identities if corpora.is_held_out(i)]      # no state, no order
    assert 0.015 < len(held) / len(identities) < 0.025


def test_decontamination_finds_evaluation_texts_inside_documents(corpora, shared_data):
    evaluation = corpora.EvaluationTexts(shared_data, quick=True)
    dev = (shared_data / "downstream" / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()[1:]
    long_sentence = next(line.split("\t")[0] for line in dev if len(corpora.words(line.split("\t")[0])) >= 10)
    document = "The film opened in May.\n\nCritics wrote: " + long_sentence.upper().replace(" ", "  ") + " Then more."
    assert evaluation.found_in(document).startswith("an SST-2 dev or STS-B sentence")
    assert evaluation.found_in("A wholly unrelated paragraph about the harbour and its ships, long enough.") is None
    short = next(line.split("\t")[0] for line in dev if len(corpora.words(line.split("\t")[0])) < 6)
    assert evaluation.found_in(f"nothing else but {short}") is None         # too short to be evidence
    import gzip
    with gzip.open(shared_data / "corpora" / "imdb" / "test.jsonl.gz", "rt") as handle:
        review = json.loads(handle.readline())["text"]
    assert evaluation.found_in(review.replace("<br />", "\n\n")) == "an IMDB test review"


def _done(root: Path, corpus: str, name: str, mlm: float, probe: float) -> None:
    run = root / "search" / corpus / name
    run.mkdir(parents=True)
    (run / "DONE").write_text(json.dumps({"heldout_mlm_acc": mlm, "selection_probe": probe}))


def test_the_selection_rule(recipe, tmp_path):
    figures = {"tiny_v8k_s128_mlm_lr1e-3": (0.30, 0.66), "tiny_v16k_s128_mlm_lr1e-3": (0.25, 0.64),
               "tiny_v30k_s128_mlm_lr1e-3": (0.20, 0.65), "mini_v16k_s128_mlm_lr6e-4": (0.27, 0.70),
               "tiny_v16k_s64_mlm_lr1e-3": (0.22, 0.63), "tiny_v16k_s128_nsp_lr1e-3": (0.24, 0.69),
               "tiny_v16k_s128_mlm_lr2e-3": (0.26, 0.60)}
    for name, (mlm, probe) in figures.items():
        _done(tmp_path, "domain", name, mlm, probe)
    choice = recipe.choose(tmp_path, "domain", recipe.TRIES)
    # vocabulary by the probe (8k: 0.66), not by MLM accuracy; 64 loses on the probe; NSP loses on MLM accuracy;
    # mini (0.27) and 2e-3 (0.26) both beat the base's 0.25: the higher, mini at its rate, wins
    assert choice["recipe"] == {"model": "mini", "vocab": 8000, "seq": 128, "objective": "mlm", "lr": 6e-4}
    assert json.loads((tmp_path / "search" / "domain" / "choice.json").read_text())["recipe"] == choice["recipe"]
    assert len(choice["reasons"]) == 4


def test_budgets_are_steps_from_the_measured_speed(recipe, tmp_path):
    (tmp_path / "calibration.json").write_text(json.dumps({"tiny_v16000_s128": {"steps_per_minute": 201.3}}))
    assert recipe.budget_steps(tmp_path, recipe.BASE, 120) == 24160     # 120 x 201.3, in multiples of ten
    assert recipe.budget_steps(tmp_path, recipe.BASE, 6) == 1210


def test_calibration_waits_for_a_quiet_machine_and_refuses_a_busy_one(recipe, monkeypatch):
    loads = iter([2.0, 1.2, 0.3])
    monkeypatch.setattr(recipe.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(recipe.time, "sleep", lambda seconds: None)
    assert recipe.wait_until_quiet(limit_s=60) == 0.3
    monkeypatch.setattr(recipe.os, "getloadavg", lambda: (3.0, 0.0, 0.0))
    with pytest.raises(RuntimeError, match="calibrate on a quiet machine"):
        recipe.wait_until_quiet(limit_s=0)
