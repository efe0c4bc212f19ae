"""The report rule: <root>/report/ with scores.csv (task, main metric, score, every dev metric, W&B), scores.png and
each pre-training's curves, which Snakemake's HTML report shows beside the stage graph and run times."""
from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

from pipeline.orchestration import runs

COLUMNS = ("task", "metric", "score", "metrics", "stage", "wandb")
RUN_URL = re.compile(r"https?://\S+/runs/[\w-]+")


def report_files(root: Path, specs: dict) -> list[str]:
    """What the report writes (the report rule's outputs)."""
    curves = [f"curves-{name}.png" for name, spec in specs.items() if spec.entry == "train"]
    return [str(Path(root) / "report" / name) for name in ("scores.csv", "scores.png", *curves)]


def wandb_links(output_dir: Path, log_path: Path) -> list[str]:
    """Where a stage's W&B run can be seen: the run's URL (online; W&B prints it in the log), or its offline directory
    (for `wandb sync`). Nothing when W&B was off."""
    text = log_path.read_text(encoding="utf-8", errors="replace") if log_path.is_file() else ""
    links = list(dict.fromkeys(RUN_URL.findall(text)))
    links += [f"offline: {d} (upload with `wandb sync {d}`)" for d in sorted(output_dir.glob("wandb/offline-run-*"))]
    # an online run whose URL did not reach a log we can read: its files still name the run
    return links or [f"run files: {d}" for d in sorted(output_dir.glob("wandb/run-*"))]


def _picture(path: Path, draw) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    draw(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(launch: dict, log: str) -> None:
    root, out = Path(launch["workflow"]["root"]), Path(launch["workflow"]["root"]) / "report"
    finished = {name: runs.finished_run(root, name) for name in launch["stages"]}
    done = {name: run[0] for name, run in finished.items()
            if run and run[1].get("identity") == launch["stages"][name]["identity"]}
    scores = []
    for name, run_dir in done.items():
        if (run_dir / "metrics.json").is_file():
            record = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
            scores.append({"task": record.get("task", name), "metric": record.get("main_metric"),
                           "score": f"{record['score']:.4f}", "stage": name,
                           "metrics": "; ".join(f"{split} {metric} {value:.4f}"
                                                for split, values in record.get("metrics", {}).items()
                                                for metric, value in values.items() if isinstance(value, (int, float))),
                           "wandb": " ".join(wandb_links(run_dir, run_dir / "stage.log"))})
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scores.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(scores)
    _picture(out / "scores.png", lambda ax: (ax.bar([r["task"] for r in scores], [float(r["score"]) for r in scores]),
                                             ax.set_title("Downstream scores (dev, main metric)")))
    for name, spec in launch["stages"].items():
        curves = done.get(name, root / "none") / "curves.png"
        if spec["entry"] == "train" and curves.is_file():
            shutil.copyfile(curves, out / f"curves-{name}.png")
        elif spec["entry"] == "train":
            _picture(out / f"curves-{name}.png", lambda ax, name=name: (ax.axis("off"), ax.text(
                0.5, 0.5, f"{name}: no curves (not finished, or export.plot=false)", ha="center")))
    Path(log).write_text("\n".join(f"{r['task']}: {r['metric']} {r['score']} ({r['stage']})" for r in scores) + "\n",
                         encoding="utf-8")
