"""pipeline.finetuning.tasks metrics against numbers worked out by hand (the arithmetic is in the comments)."""
from __future__ import annotations

import math
import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from pipeline.finetuning.tasks import TASKS, get_task  # noqa: E402


def test_accuracy():
    # predictions 1 0 1 1 vs labels 1 0 0 1: three of four right
    assert get_task("sst2").metrics([1, 0, 1, 1], [1, 0, 0, 1]) == {"acc": 0.75}
    # MNLI, three classes: 0 1 2 2 1 vs 0 1 1 2 0: rows 0, 1, 3 right -> 3/5
    assert get_task("mnli").metrics(np.array([0, 1, 2, 2, 1]), np.array([0, 1, 1, 2, 0])) == {"acc": 0.6}


def test_f1_and_accuracy_for_mrpc_and_qqp():
    preds = [1, 1, 1, 1, 0, 0]
    gold = [1, 1, 0, 0, 1, 0]
    # TP = 2 (rows 0, 1), FP = 2 (rows 2, 3), FN = 1 (row 4), TN = 1 (row 5)
    # F1 = 2TP / (2TP + FP + FN) = 4 / 7; accuracy = (TP + TN) / 6 = 1/2; mean = (1/2 + 4/7) / 2 = 15/28
    for name in ("mrpc", "qqp"):
        scores = get_task(name).metrics(preds, gold)
        assert set(scores) == {"f1", "acc", "acc_and_f1"}
        assert scores["f1"] == pytest.approx(4 / 7)
        assert scores["acc"] == pytest.approx(0.5)
        assert scores["acc_and_f1"] == pytest.approx(15 / 28)


def test_matthews_correlation_for_cola():
    preds = [1, 1, 1, 0, 0, 0, 1, 1]
    gold = [1, 1, 0, 0, 0, 1, 1, 1]
    # TP = 4 (rows 0, 1, 6, 7), FP = 1 (row 2), FN = 1 (row 5), TN = 2 (rows 3, 4)
    # MCC = (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (8 - 1) / sqrt(5*5*3*3) = 7/15
    assert get_task("cola").metrics(preds, gold) == {"mcc": pytest.approx(7 / 15)}
    # one class predicted throughout: no correlation, 0 (not NaN)
    assert get_task("cola").metrics([1, 1, 1, 1], [1, 0, 1, 0]) == {"mcc": 0.0}


def test_correlations_for_stsb():
    preds = [1.0, 2.0, 3.0, 4.0]
    gold = [2.0, 5.0, 4.0, 9.0]
    # Pearson: means 2.5 and 5; deviations (-1.5, -0.5, 0.5, 1.5) and (-3, 0, -1, 4)
    #   sum of products = 4.5 + 0 - 0.5 + 6 = 10; sums of squares 5 and 26 -> r = 10 / sqrt(130)
    # Spearman: ranks (1, 2, 3, 4) and (1, 3, 2, 4); d = (0, -1, 1, 0), sum d^2 = 2
    #   rho = 1 - 6 * 2 / (4 * (16 - 1)) = 1 - 12/60 = 0.8
    scores = get_task("stsb").metrics(preds, gold)
    assert scores["pearson"] == pytest.approx(10 / math.sqrt(130))
    assert scores["spearman"] == pytest.approx(0.8)
    assert scores["pearson_spearman_mean"] == pytest.approx((10 / math.sqrt(130) + 0.8) / 2)
    assert math.isnan(get_task("stsb").metrics([3.0, 3.0, 3.0], [1.0, 2.0, 4.0])["pearson"])  # constant: undefined


def test_every_task_reports_its_main_metric():
    predictions = {"classification": [0, 1, 1, 0], "multiple_choice": [0, 3, 2, 1], "regression": [0.5, 2.0, 4.0, 1.0]}
    labels = {"classification": [0, 1, 0, 0], "multiple_choice": [0, 3, 1, 1], "regression": [1.0, 2.5, 5.0, 0.0]}
    expected = {"cola": {"mcc"}, "stsb": {"pearson", "spearman", "pearson_spearman_mean"},
                "mrpc": {"f1", "acc", "acc_and_f1"}, "qqp": {"f1", "acc", "acc_and_f1"}}
    for name, task in TASKS.items():
        scores = task.metrics(predictions[task.kind], labels[task.kind])
        assert set(scores) == expected.get(name, {"acc"}), name
        assert task.main_metric in scores and all(isinstance(v, float) for v in scores.values())


def test_metrics_on_real_dev_labels(shared_data):
    """Majority-class baselines on SST-2 dev, counted straight from the file."""
    with open(shared_data / "downstream" / "glue" / "SST-2" / "dev.tsv", encoding="utf-8") as stream:
        gold = [int(line.rstrip("\n").split("\t")[1]) for line in list(stream)[1:]]
    positive = sum(gold)
    assert get_task("sst2").metrics([1] * len(gold), gold) == {"acc": pytest.approx(positive / 872)}
    assert get_task("sst2").metrics(gold, gold) == {"acc": 1.0}


def test_bad_metric_input():
    sst2 = get_task("sst2")
    with pytest.raises(ValueError, match="3 predictions for 2 labels"):
        sst2.metrics([0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match=r"shape \(2, 2\) \(logits\? take argmax over the last axis first\)"):
        sst2.metrics([[0.1, 0.9], [0.8, 0.2]], [1, 0])
    with pytest.raises(ValueError, match="labels include -1"):
        sst2.metrics([0, 1], [-1, -1])
    with pytest.raises(ValueError, match=r"predictions must be label ids in 0..1; found \[2\]"):
        sst2.metrics([0, 2], [0, 1])
    with pytest.raises(ValueError, match="not scores"):
        sst2.metrics([0.3, 0.9], [0, 1])
    with pytest.raises(ValueError, match="no predictions"):
        sst2.metrics([], [])
    with pytest.raises(ValueError, match="labels include NaN"):
        get_task("stsb").metrics([1.0, 2.0], [float("nan"), 1.0])
