"""The training loss of a run of the README's 1,800-step sample demo, whole and around step 1,346 where the old
shuffle plan's one-row-group tail made it jump (pipeline/pretraining/data/epoch_plan.py, plans 1 and 2).

    python studies/pretraining_pays/plot_epoch_plan.py outputs/train/epoch_plan_1800_tiny/csv/metrics.csv \
        [--old <a plan-1 run's metrics.csv>] --out studies/pretraining_pays/figures/epoch_plan_1800_steps.png

Prints the mean loss of the steps before, inside and after the old tail's window, per run.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.core.run.curves import read_metrics

ZOOM = (1100, 1700)
TAIL = (1346, 1601)       # the window the old plan's last buffer of the epoch covered (earlier_downstream.md)


def losses(csv_path: Path) -> list[tuple[int, float]]:
    # Lightning logs a step's metrics under the number of steps done before it: +1 is the step count.
    return [(step + 1, value) for step, value in read_metrics(csv_path).get("train/loss", [])]


def mean_between(points: list[tuple[int, float]], low: int, high: int) -> float:
    values = [value for step, value in points if low <= step < high]
    return sum(values) / len(values) if values else float("nan")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("new", type=Path, help="metrics.csv of a run with the current plan")
    parser.add_argument("--old", type=Path, help="metrics.csv of a run with the old plan (plan 1), if any")
    parser.add_argument("--out", type=Path, default=Path("studies/pretraining_pays/figures/epoch_plan_1800_steps.png"))
    args = parser.parse_args(argv)
    runs = {"plan 2 (near-equal buffers)": losses(args.new)}
    if args.old:
        runs["plan 1 (old: tail of one row group)"] = losses(args.old)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True)
    for label, points in runs.items():
        steps, values = zip(*points)
        for ax in axes:
            ax.plot(steps, values, label=label, linewidth=1)
        before = mean_between(points, TAIL[0] - 150, TAIL[0])
        inside = mean_between(points, *TAIL)
        after = mean_between(points, TAIL[1], TAIL[1] + 150)
        print(f"{label}: mean train/loss, steps {TAIL[0] - 150}-{TAIL[0] - 1}: {before:.3f}; "
              f"{TAIL[0]}-{TAIL[1] - 1}: {inside:.3f}; {TAIL[1]}-{TAIL[1] + 149}: {after:.3f}")
    axes[1].set_xlim(*ZOOM)
    zoomed = [v for points in runs.values() for s, v in points if ZOOM[0] <= s <= ZOOM[1]]
    if zoomed:
        axes[1].set_ylim(min(zoomed) - 0.1, max(zoomed) + 0.1)
    for ax, title in zip(axes, ("the whole run", f"steps {ZOOM[0]:,}-{ZOOM[1]:,}")):
        ax.axvspan(*TAIL, color="grey", alpha=0.15, label="the old plan's tail (steps 1,346-1,600)")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("train/loss (MLM + NSP)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
