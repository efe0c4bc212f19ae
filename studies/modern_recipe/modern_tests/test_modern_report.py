"""The report as protocol.md section 5 fixes it: each run's held-out curve read from its metrics.csv."""
from __future__ import annotations


def test_the_heldout_curve_counts_a_step_validated_twice_once_as_last_logged(modern_importable):
    from modern_report import heldout_curve

    rows = [{"step": "99", "val/mlm_acc": "0.10"}, {"step": "149", "train/mlm_acc": "0.2", "val/mlm_acc": ""},
            {"step": "199", "val/mlm_acc": "0.20"}, {"step": "99", "val/mlm_acc": "0.11"}]
    assert heldout_curve(rows) == [(99, 0.11), (199, 0.20)]

