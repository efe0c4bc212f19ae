"""What a fine-tuning run leaves besides its logs:

    metrics.json                 dev metrics per split, the main score, settings, data and truncation counts
    predictions/<split>.tsv      idx, prediction, label: each dev row's prediction beside its gold label
    predictions/<split>/<file>   a span or token task's own files (SQuAD: predictions.json, nbest_predictions.json;
                                 NER: predictions in CoNLL format)
    glue_submission/<Task>.tsv   GLUE leaderboard files for the test splits that were given
    curves.png                   training loss per step and the dev metrics per epoch, from csv/metrics.csv
    hf_export/                   transformers' BertForSequenceClassification / BertForMultipleChoice / ... or, from
                                 a ModernBERT checkpoint, ModernBertForSequenceClassification / ...; + tokenizer
"""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.checkpoints.weights import HF_EXPORT_DIR
from pipeline.core.run.curves import PLOT_NAME, Panel, plot_curves, read_metrics
from pipeline.core.run.logger_config import csv_metrics_path

METRICS_FILE = "metrics.json"
PREDICTIONS_DIR = "predictions"
SUBMISSION_DIR = "glue_submission"


def write_run_outputs(*, output_dir: Path, task, evaluations: dict, split_rows: dict, test_predictions: dict,
                      model, tokenizer_source: Path, export_hf: bool, plot: bool,
                      summary: dict[str, Any]) -> dict[str, str]:
    """evaluations: split -> module.Evaluation (every row's prediction, in row order); test_predictions: test split ->
    every row's prediction, in row order; split_rows: split -> its features (their `idx`)."""
    files: dict[str, str] = {}
    for split, evaluation in evaluations.items():
        for name, content in evaluation.artefacts.items():   # span / token tasks: their own prediction files
            files[f"predictions/{split}/{name}"] = str(write_artefact(output_dir / PREDICTIONS_DIR / split / name,
                                                                      content))
        if evaluation.predictions is None:
            continue
        path = write_predictions(output_dir / PREDICTIONS_DIR / f"{split}.tsv", task, _row_ids(split_rows[split]),
                                 evaluation.predictions, evaluation.labels)
        files[f"predictions/{split}"] = str(path)
    if test_predictions:
        from pipeline.finetuning.tasks.submission import write_submission

        for split, predictions in test_predictions.items():
            if task.submission_file(split) is None:   # SWAG's test set: no leaderboard file format here
                continue
            path = write_submission(task, split, _row_ids(split_rows[split]), predictions,
                                    output_dir / SUBMISSION_DIR)
            files[f"submission/{split}"] = str(path)
    if export_hf:
        id2label = (dict(enumerate(task.label_names)) if task.label_names and task.kind in ("classification", "token")
                    else None)
        files["hf_export"] = str(export_task_model(model, output_dir / HF_EXPORT_DIR, tokenizer_source, id2label))
    csv_path = csv_metrics_path(output_dir)
    if plot and csv_path.is_file():
        files["plot"] = str(plot_finetune_curves(csv_path, output_dir / PLOT_NAME, task.name, task.main_metric))
    (output_dir / METRICS_FILE).write_text(json.dumps({**summary, "files": files}, indent=2) + "\n")
    files["metrics"] = str(output_dir / METRICS_FILE)
    return files


def export_task_model(model, out_dir: Path, tokenizer_source: Path, id2label: dict[int, str] | None) -> Path:
    """The fine-tuned model as transformers' class of its name (AutoModelFor<task> loads it), with its tokenizer."""
    from model.architectures import is_modernbert

    if is_modernbert(model.config):
        from model.modernbert.hf_files import export_modernbert_hf

        return export_modernbert_hf(model, out_dir, tokenizer_source, id2label=id2label)
    from model.bert.hf_files import export_hf_task

    return export_hf_task(model, out_dir, tokenizer_source, id2label=id2label)


def _row_ids(features) -> np.ndarray:
    """Each feature row's id in its file (`idx`), in row order: predictions come in the same order."""
    return np.asarray(features["idx"][:])


def write_artefact(path: Path, content: Any) -> Path:
    """A task's prediction file: text as is (CoNLL output), anything else as JSON (SQuAD's predictions.json)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def write_predictions(path: Path, task, idx: np.ndarray, predictions: np.ndarray, labels: np.ndarray | None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(["idx", "prediction", "label"])
        for i, (row_id, prediction) in enumerate(zip(idx, predictions)):
            gold = task.prediction_name(labels[i]) if labels is not None else ""
            writer.writerow([int(row_id), task.prediction_name(prediction), gold])
    return path


def plot_finetune_curves(csv_path: Path, out_path: Path, task_name: str, main_metric: str) -> Path:
    """The training loss per step, and each evaluation's main metric and loss."""
    metrics = read_metrics(csv_path)
    evaluated = tuple(sorted(column for column in metrics if column.endswith(f"/{main_metric}")
                             or column.endswith("/loss") and not column.startswith("train/")))
    panels = [Panel("training loss", ("train/loss",)),
              Panel(f"evaluation ({main_metric}, loss)", evaluated, markers=True)]
    return plot_curves(metrics, out_path, panels, f"BERT fine-tuning: {task_name}")
