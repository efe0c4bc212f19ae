"""The report as protocol.md section 5 and 7 fix it, rebuilt from the committed record alone (study_record.restore into
a new --out, as a machine that lacks the study's outputs would): each finished run's held-out curve, steps and tokens,
every rate try, and the committed report is the one the record rebuilds."""
from __future__ import annotations

import json


def test_the_heldout_curve_counts_a_step_validated_twice_once_as_last_logged(modern_importable, tmp_path):
    from modern_report import heldout_curve

    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text("step,train/mlm_acc,val/mlm_acc\n99,,0.10\n149,0.2,\n199,,0.20\n"
                                                  "99,,0.11\n")
    assert heldout_curve(tmp_path) == [(99, 0.11), (199, 0.20)]


def test_the_report_rebuilt_from_the_record_is_the_committed_one(modern_importable, tmp_path):
    from modern_report import TOKENS_PER_STEP, build_report
    from study_record import restore

    record = modern_importable / "record"
    restore(tmp_path, record)
    committed = {name: (record / "report" / name).read_text() for name in ("report.md", "results.json")}
    build_report(tmp_path, quick=False)
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    for arm in results["runs"].values():
        for run in arm["runs"]:
            done = json.loads((record / "pretrain" / run["run"] / "DONE").read_text())
            assert run["finished"] and run["steps"] == done["steps"] == arm["budget_steps"], run["run"]
            assert run["tokens"] == done["steps"] * TOKENS_PER_STEP == done["steps"] * 32 * 128
            steps = [step + 1 for step, _ in run["heldout_curve"]]
            assert steps == [done["steps"] * k // 10 for k in range(1, 11)], run["run"]   # ten validations
            assert run["heldout_curve"][-1][1] == done["heldout_mlm_acc"], run["run"]
    for name, rates in results["rates"].items():   # {task: the ladder's tries and choice} for every run and twin
        assert set(rates) == {"stsb", "sst2"}, name
        assert all(f"{rates[t]['chosen']:g}" in rates[t]["scores"] for t in rates), name
    assert len(results["rates"]) == 10   # five runs and their five twins
    for name in ("report.md", "results.json"):
        assert (tmp_path / "report" / name).read_text() == committed[name], name
