"""The study's whole chain at its quick scale, as CI runs it:
`python studies/pretraining_pays/bench_downstream.py --quick --shared-data <shared data>` (into a temporary --out):
corpora, calibration, the recipe tries and the choice, every pre-training arm, every arm's tasks at every label
budget, the baseline and the report."""
from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_the_quick_chain_runs_end_to_end_and_reports_every_endpoint(study_script, shared_data, tmp_path):
    result = study_script("bench_downstream.py", "--quick", "--shared-data", str(shared_data), "--out",
                              str(tmp_path), HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "apitools not found" not in result.stdout + result.stderr   # known noise, silenced as the entry points do
    for corpus in ("domain", "general"):
        assert json.loads((tmp_path / "search" / corpus / "choice.json").read_text())["recipe"]["model"] == "tiny"
    for arm in ("domain_120", "general_120", "domain_60", "general_60", "domain_60_other"):
        assert (tmp_path / "pretrain" / arm / "hf_export" / "config.json").is_file(), arm
    report = json.loads((tmp_path / "report" / "results.json").read_text())
    assert report["quick"] is True and report["missing"] == []
    primary = [(e["endpoint"], e["arm"], e["against"], e["task"], e["budget"]) for e in report["endpoints"]["primary"]]
    assert primary == [("a", "domain_120", "random_domain", "sst2", "1000"),
                       ("b", "general_120", "random_general", "stsb", "full"),
                       ("c", "domain_120", "random_domain", "imdb", "1000")]
    assert {"random_general", "random_domain", "general_60", "general_120", "domain_60", "domain_120",
            "domain_60_other", "bag_of_words"} == set(report["table"])
    assert report["objective_comparison"]["heldout_mlm_acc"]["domain_60"] is not None
