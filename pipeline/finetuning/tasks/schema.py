"""The columns every task's ``read()`` returns, whatever the source format.

Sentence tasks: ``idx`` (int64), ``text_a`` (str), ``text_b`` (str, or None for single-sentence tasks), ``label``
(int64 label id, -1 when the split has no labels; float32 for STS-B, NaN when unlabelled).
SWAG: ``idx``, ``context`` (sent1), ``start`` (sent2), ``endings`` (4 str), ``label`` (int64, -1 when unlabelled).
"""
from __future__ import annotations

import math

import datasets

NO_LABEL = -1
"""The label id of an example from an unlabelled (test) split; NaN for regression."""

NO_SCORE = math.nan

STSB_SCORE_RANGE = (0.0, 5.0)
"""STS-B similarity scores lie in [0, 5]; anything else is a broken row."""


def features(kind: str) -> datasets.Features:
    """The output columns for a task kind ("classification" | "regression" | "multiple_choice")."""
    if kind == "multiple_choice":
        return datasets.Features({
            "idx": datasets.Value("int64"),
            "context": datasets.Value("string"),
            "start": datasets.Value("string"),
            "endings": datasets.List(datasets.Value("string")),
            "label": datasets.Value("int64"),
        })
    return datasets.Features({
        "idx": datasets.Value("int64"),
        "text_a": datasets.Value("string"),
        "text_b": datasets.Value("string"),
        "label": datasets.Value("float32" if kind == "regression" else "int64"),
    })


def empty_columns(kind: str) -> dict[str, list]:
    """A batch of the output columns, to fill row by row."""
    return {name: [] for name in features(kind)}


def append_row(batch: dict[str, list], kind: str, idx: int, texts: list[str | None], endings: list[str],
               label) -> None:
    """Add one normalised example to ``batch`` (``texts`` = [text_a, text_b])."""
    batch["idx"].append(idx)
    if kind == "multiple_choice":
        batch["context"].append(texts[0])
        batch["start"].append(texts[1])
        batch["endings"].append(endings)
    else:
        batch["text_a"].append(texts[0])
        batch["text_b"].append(texts[1])
    batch["label"].append(label)
