"""study_report.py from synthetic result files: endpoints met or not met as their intervals say, arms and
seeds without files shown as missing (never filled in), the pre-training curves read from the runs' CSV logs."""
from __future__ import annotations

import json

import pytest

SEEDS = (1, 2, 3, 4, 5)


@pytest.fixture(scope="module")
def modules(study_importable):
    import study_report
    import study_results
    return study_report, study_results


def _write(results, out, arm, task, budget, metrics_by_seed, objective="mlm"):
    for seed, metrics in metrics_by_seed.items():
        results.write_json(results.result_path(out, arm, task, budget, seed),
                           {"arm": arm, "task": task, "budget": budget, "seed": seed, "quick": False,
                            "metrics": metrics, "objective": objective})


@pytest.fixture
def study(modules, tmp_path):
    """(a) clearly met, (b) not met (gains both ways), (c) 3 of 5 seeds; general_60, domain_60 and domain_60_other
    never ran; a pre-training log for domain_120 and none for general_120."""
    _, results = modules
    out = tmp_path / "study"
    base = {1: 0.60, 2: 0.62, 3: 0.61, 4: 0.63, 5: 0.59}
    _write(results, out, "random_domain", "sst2", "1000", {s: {"acc": v} for s, v in base.items()})
    _write(results, out, "domain_120", "sst2", "1000", {s: {"acc": v + 0.05 + 0.002 * s} for s, v in base.items()})
    _write(results, out, "random_domain", "imdb", "1000", {s: {"acc": 0.7} for s in SEEDS})
    _write(results, out, "domain_120", "imdb", "1000", {s: {"acc": 0.8} for s in (1, 2, 3)})
    gains = {1: 0.03, 2: -0.04, 3: 0.02, 4: -0.01, 5: 0.01}
    _write(results, out, "random_general", "stsb", "full", {s: {"pearson": 0.2, "spearman": 0.2} for s in SEEDS})
    _write(results, out, "general_120", "stsb", "full",
           {s: {"pearson": 0.2 + g, "spearman": 0.2} for s, g in gains.items()})
    _write(results, out, "bag_of_words", "sst2", "1000", {s: {"acc": 0.7} for s in SEEDS})
    results.write_json(results.zeroshot_path(out, "domain_120"),
                       {"arm": "domain_120", "task": "zeroshot", "quick": False, "accuracy": 0.57, "init": "x",
                        "words": {"awful": {"pieces": ["aw", "##ful"]}}, "split_words": ["awful"]})
    run = tmp_path / "pretrain" / "domain_120"
    (run / "csv").mkdir(parents=True)
    (run / "csv" / "metrics.csv").write_text("epoch,step,train/loss,val/mlm_acc\n0,9,7.1,\n0,19,,0.11\n0,39,,0.18\n")
    return out, {"domain_120": run, "general_120": tmp_path / "pretrain" / "general_120"}


def test_endpoints_follow_the_paired_intervals(modules, study):
    report, _ = modules
    out, runs = study
    path = report.build_report(out, runs)
    found = json.loads((out / "report" / "results.json").read_text())
    primary = {e["endpoint"]: e for e in found["endpoints"]["primary"]}
    assert primary["a"]["verdict"] == "met"
    assert primary["a"]["mean"] == pytest.approx(0.056) and primary["a"]["low"] > 0
    assert primary["b"]["verdict"] == "not met" and primary["b"]["low"] < 0 < primary["b"]["high"]
    assert primary["c"]["verdict"] == "undecided: 3 of 5 paired seeds"
    text = path.read_text()
    assert "(a) domain_120 against random_domain, sst2 1000 acc: +0.0560 [" in text and "**met**" in text
    assert "(b) general_120 against random_general, stsb full pearson" in text and "**not met**" in text
    assert {e["verdict"] for e in found["endpoints"]["secondary"]} == {"undecided: 0 of 5 paired seeds"}


def test_what_did_not_run_is_shown_missing(modules, study):
    report, _ = modules
    out, runs = study
    text = report.build_report(out, runs).read_text()
    found = json.loads((out / "report" / "results.json").read_text())
    main_table = text.split("CoLA cannot move")[0]
    table = {line.split(" | ")[0].lstrip("| "): line for line in main_table.splitlines() if line.startswith("| ")}
    for arm in ("general_60", "domain_60", "domain_60_other"):
        assert table[arm].count("missing") == 10        # nine cells and zero-shot
        assert f"{arm}: no results at all" in found["missing"]
    assert "| missing | 0.6660 ± 0.0158 | missing |" in table["domain_120"]   # SST-2 1,000, five seeds
    assert "0.8000 ± 0.0000 (3 of 5 seeds)" in table["domain_120"]
    assert table["domain_120"].rstrip(" |").endswith("0.5700")
    assert "pre-training run general_120: no csv/metrics.csv" in found["missing"]
    assert found["mlm_curves"]["domain_120"] == [[19, 0.11], [39, 0.18]]
    assert "awful -> aw ##ful" in text
    assert (out / "report" / "score_vs_labels.png").stat().st_size > 0
    assert (out / "report" / "mlm_curves.png").stat().st_size > 0
    assert (out / "report" / "gains_vs_labels.png").stat().st_size > 0


def test_an_empty_study_reports_everything_missing(modules, tmp_path):
    report, _ = modules
    text = report.build_report(tmp_path).read_text()
    assert "**undecided: 0 of 5 paired seeds**" in text
    assert "random_general: no results at all" in text


def test_a_quick_result_is_not_counted_as_the_study(modules, study):
    _, results = modules
    out, _ = study
    path = results.result_path(out, "domain_120", "sst2", "1000", 1)
    with pytest.raises(ValueError, match="full-scale result and this run is quick"):
        results.read_done(path, quick=True)


def test_the_recipe_search_is_reported_per_try_and_corpus(modules, tmp_path):
    """Every try's steps, held-out MLM accuracy and selection probe, per corpus, from the tries' DONE files (a try a
    corpus has not run is missing, not filled in), in the protocol's order; each corpus's choice with its reasons."""
    report, _ = modules
    out = tmp_path / "study"

    def done(corpus, name, steps, acc, probe):
        path = out / "search" / corpus / name / "DONE"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"corpus": corpus, "steps": steps, "heldout_mlm_acc": acc,
                                    "selection_probe": probe, "recipe": {}}))

    done("domain", "tiny_v16k_s128_mlm_lr2e-3", 1720, 0.1329, 0.574)
    done("domain", "tiny_v8k_s128_mlm_lr1e-3", 2310, 0.13044, 0.553)
    done("general", "tiny_v8k_s128_mlm_lr1e-3", 2310, 0.1356, 0.593)
    (out / "search" / "domain" / "choice.json").write_text(json.dumps(
        {"corpus": "domain", "recipe": {"model": "tiny", "vocab": 16000}, "reasons": ["vocabulary 16000, because"]}))
    text = report.build_report(out).read_text()
    section = text[text.index("## The recipe search"):text.index("## Figures")]
    rows = [line for line in section.splitlines() if line.startswith("| tiny_")]
    assert rows == ["| tiny_v8k_s128_mlm_lr1e-3 | 2,310 | 0.1304 | 0.5530 | 2,310 | 0.1356 | 0.5930 |",
                    "| tiny_v16k_s128_mlm_lr2e-3 | 1,720 | 0.1329 | 0.5740 | missing | missing | missing |"]
    assert "- domain: model tiny, vocab 16000; vocabulary 16000, because" in section
    assert "- general: no choice yet (missing: search/general/choice.json)" in section
    results = json.loads((out / "report" / "results.json").read_text())
    assert results["search"]["general"]["tries"]["tiny_v8k_s128_mlm_lr1e-3"]["steps"] == 2310
