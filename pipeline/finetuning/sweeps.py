"""The best dev score per task of a fine-tuning sweep, chosen as the paper chooses: the run (learning rate, seed)
with the best dev score of the task's main metric. Also the mean and spread over seeds at that learning rate,
which the paper does not report but a reader of a small-data task (RTE, MRPC, CoLA) should see.

    python pipeline/sweep_summary.py outputs/finetune/multirun/2026-11-22/10-00-00 [more dirs] [--csv table.csv]

Reads every metrics.json below the given directories (what pipeline/finetune.py writes per run); prints a Markdown
table and writes the same rows as CSV (default: summary.csv in the first directory).
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

COLUMNS = ("task", "metric", "best", "lr", "seed", "runs", "mean_at_best_lr", "sd_at_best_lr", "other_metrics",
           "run")


def read_runs(directories: list[Path]) -> list[dict]:
    runs = []
    for directory in directories:
        if not directory.is_dir():
            raise FileNotFoundError(f"{directory} is not a directory")
        for path in sorted(directory.rglob("metrics.json")):
            record = json.loads(path.read_text())
            if "task" in record and "score" in record:   # a fine-tuning run (not some other metrics.json)
                record["run"] = str(path.parent)
                runs.append(record)
    return runs


def best_per_task(runs: list[dict]) -> list[dict]:
    rows = []
    for task in sorted({run["task"] for run in runs}):
        task_runs = [run for run in runs if run["task"] == task]
        best = max(task_runs, key=lambda run: run["score"])
        lr = best["hyperparameters"]["lr"]
        same_lr = [run["score"] for run in task_runs if run["hyperparameters"]["lr"] == lr]
        others = "; ".join(f"{split} " + ", ".join(f"{name} {value:.4f}" for name, value in metrics.items())
                           for split, metrics in best["metrics"].items())
        rows.append({
            "task": task, "metric": best["main_metric"], "best": round(best["score"], 4), "lr": lr,
            "seed": best["hyperparameters"]["seed"], "runs": len(task_runs),
            "mean_at_best_lr": round(statistics.mean(same_lr), 4),
            "sd_at_best_lr": round(statistics.stdev(same_lr), 4) if len(same_lr) > 1 else 0.0,
            "other_metrics": others, "run": best["run"],
        })
    return rows


def markdown(rows: list[dict]) -> str:
    header = ["task", "metric", "best dev", "lr", "seed", "runs", "mean ± sd at that lr", "all dev metrics"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append(f"| {row['task']} | {row['metric']} | {row['best']:.4f} | {row['lr']:g} | {row['seed']} | "
                     f"{row['runs']} | {row['mean_at_best_lr']:.4f} ± {row['sd_at_best_lr']:.4f} | "
                     f"{row['other_metrics']} |")
    return "\n".join(lines)


def write_csv(rows: list[dict], path: Path) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directories", nargs="+", type=Path, help="sweep (or run) directories")
    parser.add_argument("--csv", type=Path, default=None, help="where to write the CSV (default: <first>/summary.csv)")
    args = parser.parse_args(argv)
    try:
        runs = read_runs(args.directories)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not runs:
        print(f"error: no fine-tuning metrics.json below {', '.join(map(str, args.directories))}", file=sys.stderr)
        return 2
    rows = best_per_task(runs)
    print(markdown(rows))
    path = write_csv(rows, args.csv or args.directories[0] / "summary.csv")
    print(f"\n{len(runs)} runs; CSV: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
