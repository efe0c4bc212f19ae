"""The workflow's report rule: the downstream scores and the pictures, which Snakemake's HTML report shows beside the
stage graph and the stages' run times (`workflow.action=report`; the status action says where each stage is).

Writes <root>/report/: scores.csv (task, main metric, score, every dev metric, W&B), scores.png (the main score per
task), curves-<stage>.png for each pre-training stage (its loss and accuracy curves) and report.md (the scores).
"""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from pipeline.orchestration import runs
from pipeline.orchestration.wandb_links import wandb_links

REPORT_DIR = "report"
COLUMNS = ("task", "metric", "score", "metrics", "stage", "wandb")


def report_files(root: Path, specs: dict) -> list[str]:
    """What the report writes (the report rule's outputs)."""
    out = Path(root) / REPORT_DIR
    curves = [out / f"curves-{name}.png" for name, spec in specs.items() if spec.entry == "train"]
    return [str(p) for p in (out / "report.md", out / "scores.csv", out / "scores.png", *curves)]


def _scores(done: dict[str, Path]) -> list[dict]:
    rows = []
    for name, run_dir in done.items():
        if not (run_dir / "metrics.json").is_file():
            continue
        record = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
        flat = "; ".join(f"{split} {metric} {value:.4f}" for split, values in record.get("metrics", {}).items()
                         for metric, value in values.items() if isinstance(value, (int, float)))
        rows.append({"task": record.get("task", name), "metric": record.get("main_metric"),
                     "score": f"{record['score']:.4f}", "metrics": flat, "stage": name,
                     "wandb": " ".join(wandb_links(run_dir, run_dir / "stage.log"))})
    return rows


def _picture(path: Path, draw) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    draw(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(launch: dict, log: str | None = None) -> Path:
    root = Path(launch["workflow"]["root"])
    done = {}
    for name, spec in launch["stages"].items():
        record = runs.read_json(root / name / runs.CURRENT / runs.RECORD) or {}
        if runs.read_json(runs.sentinel_path(root, name)) and record.get("identity") == spec["identity"]:
            done[name] = (root / name / runs.CURRENT).resolve()
    scores = _scores(done)
    out = root / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scores.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(scores)

    def bars(ax):
        ax.bar([r["task"] for r in scores], [float(r["score"]) for r in scores])
        ax.set_title("Downstream scores (dev, main metric)")
    _picture(out / "scores.png", bars)
    for name, spec in launch["stages"].items():
        if spec["entry"] == "train":
            curves = done.get(name, root / "nowhere") / "curves.png"
            if curves.is_file():
                shutil.copyfile(curves, out / f"curves-{name}.png")
            else:
                _picture(out / f"curves-{name}.png", lambda ax: (ax.axis("off"), ax.text(
                    0.5, 0.5, f"{name}: no curves (not finished, or export.plot=false)", ha="center")))
    table = ["| " + " | ".join(COLUMNS[:-1]) + " |", "|---" * (len(COLUMNS) - 1) + "|"]
    table += ["| " + " | ".join(str(r[c]).replace("|", "/") for c in COLUMNS[:-1]) + " |" for r in scores]
    text = (f"# Workflow {launch['workflow']['name']}\n\n{len(done)} of {len(launch['stages']) - 1} stages done; "
            f"outputs in `{root}`.\n\n## Downstream scores (dev)\n\n" + "\n".join(table) + "\n")
    (out / "report.md").write_text(text, encoding="utf-8")
    if log:
        Path(log).write_text(text, encoding="utf-8")
    return out / "report.md"
