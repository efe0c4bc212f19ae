"""GLUE leaderboard files: one ``<TASK>.tsv`` per test set, ``index<TAB>prediction`` with a header.

The leaderboard wants all eleven files (CoLA.tsv ... WNLI.tsv, AX.tsv) zipped at the top of one archive; labels are
text for MNLI, AX, QNLI and RTE, 0/1 for the other classification tasks, and STS-B's score as a float.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pipeline.finetuning.tasks.base import Task

SUBMISSION_FILES = ("CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "QQP.tsv", "MNLI-m.tsv", "MNLI-mm.tsv",
                    "QNLI.tsv", "RTE.tsv", "WNLI.tsv", "AX.tsv")
"""Every file a complete GLUE submission holds."""


def write_submission(task: Task | str, split: str, idx: Sequence[int], predictions: Sequence, out_dir: str | Path
                     ) -> Path:
    """Write ``predictions`` (label ids; STS-B scores) for ``split``'s examples ``idx`` to the leaderboard's file
    for that split in ``out_dir``; return its path.  Rows are written in the order given."""
    if isinstance(task, str):
        from pipeline.finetuning.tasks.registry import get_task

        task = get_task(task)
    name = task.submission_file(split)
    if name is None:
        with_files = ", ".join(task.submission_files) or "none"
        raise ValueError(f"{task.name} {split}: the GLUE leaderboard takes no file for this split "
                         f"(splits with one: {with_files})")
    idx, predictions = list(idx), list(predictions)
    if len(idx) != len(predictions):
        raise ValueError(f"{task.name} {split}: {len(idx)} indices for {len(predictions)} predictions")
    if not idx:
        raise ValueError(f"{task.name} {split}: no predictions to write")
    lines = ["index\tprediction"]
    for example, prediction in zip(idx, predictions):
        if int(example) != example:
            raise ValueError(f"{task.name} {split}: index {example!r} is not an integer")
        lines.append(f"{int(example)}\t{task.prediction_name(prediction)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
