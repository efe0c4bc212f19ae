"""What a finished run leaves besides checkpoints: a Hugging Face export and a plot of its training curves.

    <output_dir>/hf_export/   config.json, model.safetensors, vocab.txt, tokenizer files: loads with
                              transformers.BertForPreTraining.from_pretrained (and AutoTokenizer) offline
    <output_dir>/curves.png   MLM / NSP / total loss and MLM / NSP accuracy against the optimizer step, from the
                              CSV log (csv/metrics.csv)
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

from model import BertForPreTraining
from model.hf_conversion import export_hf

HF_EXPORT_DIR = "hf_export"
PLOT_NAME = "curves.png"
LOSS_COLUMNS = ("train/loss", "train/mlm_loss", "train/nsp_loss")
ACCURACY_COLUMNS = ("train/mlm_acc", "train/nsp_acc")


def export_model(model: BertForPreTraining, output_dir: str | Path, shard_dir: str | Path) -> Path:
    """The HF export of `model` with the tokenizer of the shard set it was trained on (vocab.txt, tokenizer.json)."""
    return export_hf(model, Path(output_dir) / HF_EXPORT_DIR, shard_dir)


def read_metrics(csv_path: str | Path) -> dict[str, list[tuple[int, float]]]:
    """{column: [(step, value), ...]} sorted by step. A resumed run appends to the same file and may repeat the
    steps after its checkpoint (logged before a crash, then again): the row written last wins."""
    by_column: dict[str, dict[int, float]] = {}
    with open(csv_path, newline="") as handle:
        for row in csv.DictReader(handle):
            step = row.get("step")
            if not step:
                continue
            for column, value in row.items():
                if column in ("step", "epoch") or value in ("", None):
                    continue
                try:
                    number = float(value)
                except ValueError:
                    continue
                if math.isfinite(number):
                    by_column.setdefault(column, {})[int(float(step))] = number
    return {column: sorted(values.items()) for column, values in by_column.items()}


def plot_curves(csv_path: str | Path, out_path: str | Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")   # files only; never a display
    import matplotlib.pyplot as plt

    metrics = read_metrics(csv_path)
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for ax, columns, title in ((loss_ax, LOSS_COLUMNS, "loss"), (acc_ax, ACCURACY_COLUMNS, "accuracy")):
        for column in columns:
            points = metrics.get(column)
            if points:
                steps, values = zip(*points)
                # Lightning logs a step's metrics under the number of steps done before it: +1 is the step count.
                ax.plot([s + 1 for s in steps], values, label=column.removeprefix("train/"))
        ax.set_xlabel("optimizer step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend()
    acc_ax.set_ylim(0, 1)
    fig.suptitle(f"BERT pre-training: {Path(csv_path).parent.parent.name}")
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
