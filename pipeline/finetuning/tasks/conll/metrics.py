"""Entity-level precision, recall and F1, as conlleval computes them, by seqeval 1.2.2 in its default mode.

seqeval's default mode (no ``mode="strict"``) reads chunks as conlleval.pl does: a chunk starts at ``B-X``, at an
``I-X`` after ``O`` or after a tag of another type (so IOB1 and malformed IOB2 predictions are read as conlleval reads
them), and ends where the next chunk starts or at ``O``; a predicted chunk is correct when its type, start and end are
the gold chunk's. Overall scores are micro-averaged over chunks (conlleval's "overall"); per type, precision over the
predicted chunks of that type and recall over the gold ones. Where nothing was predicted (or nothing is gold)
precision (recall) is 0, as conlleval prints it. Scores are fractions (conlleval prints percentages).
"""
from __future__ import annotations

import warnings

AVERAGES = ("micro avg", "macro avg", "weighted avg")


def entity_metrics(gold: list[list[str]], pred: list[list[str]],
                   types: tuple[str, ...] | None = None) -> dict[str, float]:
    """``{"precision", "recall", "f1"}`` overall and ``"<TYPE>/precision"``, ``"<TYPE>/recall"``, ``"<TYPE>/f1"``
    for every type found in either sequence set, plus every type in ``types`` (0.0 where absent: a stable set of
    keys for logging). ``gold`` and ``pred``: per sentence, per word, tags (IOB2 or IOB1)."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted")
    for i, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted")
    metrics = {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    found: dict[str, dict] = {}
    if any(tag != "O" for sentence in (*gold, *pred) for tag in sentence):
        from seqeval.metrics import classification_report

        with warnings.catch_warnings():   # seqeval's UndefinedMetricWarning: 0 is what conlleval prints too
            warnings.simplefilter("ignore")
            report = classification_report(gold, pred, output_dict=True, zero_division=0)
        overall = report["micro avg"]
        metrics = {"precision": float(overall["precision"]), "recall": float(overall["recall"]),
                   "f1": float(overall["f1-score"])}
        found = {name: scores for name, scores in report.items() if name not in AVERAGES}
    for name in sorted(set(found) | set(types or ())):
        scores = found.get(name, {})
        metrics[f"{name}/precision"] = float(scores.get("precision", 0.0))
        metrics[f"{name}/recall"] = float(scores.get("recall", 0.0))
        metrics[f"{name}/f1"] = float(scores.get("f1-score", 0.0))
    return metrics
