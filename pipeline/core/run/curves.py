"""Training curves from a run's CSV log (<output_dir>/csv/metrics.csv), as a PNG beside it: pre-training's losses and
accuracies, fine-tuning's training loss and evaluation scores. One reader, one plotter."""
from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

PLOT_NAME = "curves.png"


@dataclasses.dataclass(frozen=True)
class Panel:
    title: str
    columns: tuple[str, ...]          # CSV columns drawn in this panel, in this order
    markers: bool = False             # evaluation points (few, far apart) rather than a dense curve
    unit_interval: bool = False       # accuracies: the y axis from 0 to 1


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


def plot_curves(metrics: dict[str, list[tuple[int, float]]], out_path: str | Path, panels: list[Panel], title: str,
                strip_prefix: str = "") -> Path:
    """One panel per Panel, side by side, each metric (read_metrics' columns) against the optimizer step; columns
    the log lacks are left out. strip_prefix is taken off the column names in the legends ("train/")."""
    import matplotlib
    matplotlib.use("Agg")   # files only; never a display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), constrained_layout=True, squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for column in panel.columns:
            points = metrics.get(column)
            if points:
                steps, values = zip(*points)
                # Lightning logs a step's metrics under the number of steps done before it: +1 is the step count.
                ax.plot([s + 1 for s in steps], values, marker="o" if panel.markers else None,
                        label=column.removeprefix(strip_prefix))
        ax.set_xlabel("optimizer step")
        ax.set_title(panel.title)
        ax.grid(alpha=0.3)
        if panel.unit_interval:
            ax.set_ylim(0, 1)
        if ax.has_data():
            ax.legend()
    fig.suptitle(title)
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
