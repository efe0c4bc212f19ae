"""GLUE's metrics (scikit-learn, scipy), as the GLUE paper and leaderboard define them.

CoLA: Matthews correlation.  STS-B: Pearson and Spearman correlation and their mean (the leaderboard's score).
MRPC, QQP: F1 of the positive class (1) and accuracy and their mean.  The others: accuracy.
"""
from __future__ import annotations

import warnings

import numpy as np

METRIC_SETS = ("acc", "acc_and_f1", "mcc", "pearson_spearman")


def compute(metric_set: str, predictions, labels, num_labels: int | None = None) -> dict[str, float]:
    """The metrics of ``metric_set`` for label-id predictions (scores for ``pearson_spearman``)."""
    if metric_set not in METRIC_SETS:
        raise ValueError(f"unknown metric set {metric_set!r}; one of {METRIC_SETS}")
    preds, gold = _checked(predictions, labels, regression=metric_set == "pearson_spearman", num_labels=num_labels)
    if metric_set == "pearson_spearman":
        return correlations(preds, gold)
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    if metric_set == "mcc":
        return {"mcc": float(matthews_corrcoef(gold, preds))}
    acc = float(accuracy_score(gold, preds))
    if metric_set == "acc":
        return {"acc": acc}
    f1 = float(f1_score(gold, preds, pos_label=1, average="binary", zero_division=0.0))
    return {"f1": f1, "acc": acc, "acc_and_f1": (acc + f1) / 2}


def correlations(predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Pearson, Spearman and their mean; NaN when either side is constant (no correlation is defined)."""
    from scipy.stats import ConstantInputWarning, pearsonr, spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConstantInputWarning)  # the NaN says it
        pearson = float(pearsonr(predictions, labels)[0])
        spearman = float(spearmanr(predictions, labels)[0])
    return {"pearson": pearson, "spearman": spearman, "pearson_spearman_mean": (pearson + spearman) / 2}


def _checked(predictions, labels, regression: bool, num_labels: int | None) -> tuple[np.ndarray, np.ndarray]:
    preds = np.asarray(predictions)
    gold = np.asarray(labels)
    if preds.ndim != 1:
        hint = " (logits? take argmax over the last axis first)" if preds.ndim == 2 and not regression else ""
        raise ValueError(f"predictions must be one value per example, got shape {preds.shape}{hint}")
    if gold.shape != preds.shape:
        raise ValueError(f"{len(preds)} predictions for {gold.shape[0] if gold.ndim else gold.size} labels")
    if preds.size == 0:
        raise ValueError("no predictions: metrics need at least one example")
    if regression:
        preds, gold = preds.astype(np.float64), gold.astype(np.float64)
        if np.isnan(gold).any():
            raise ValueError("labels include NaN (an unlabelled test split?): metrics need gold scores")
        return preds, gold
    if not (np.issubdtype(preds.dtype, np.integer) or np.all(np.mod(preds, 1) == 0)):
        raise ValueError("predictions must be label ids, not scores (take argmax of the logits first)")
    preds, gold = preds.astype(np.int64), gold.astype(np.int64)
    if (gold < 0).any():
        raise ValueError("labels include -1 (an unlabelled test split?): metrics need gold labels")
    if num_labels is not None:
        for name, values in (("predictions", preds), ("labels", gold)):
            outside = sorted(set(values.tolist()) - set(range(num_labels)))
            if outside:
                raise ValueError(f"{name} must be label ids in 0..{num_labels - 1}; found {outside[:5]}")
    return preds, gold
