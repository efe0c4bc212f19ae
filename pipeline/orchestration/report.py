"""The workflow's report: every stage's outcome and time, the downstream scores, and the pictures.

    python -m pipeline.orchestration.report <launch spec>

Writes <root>/report/: report.md, stages.csv (stage, entry, state, seconds, job, details, W&B, run directory),
scores.csv (task, main metric, score, every dev metric), scores.png (the main score per task) and
curves-<stage>.png for each pre-training stage (its loss and accuracy curves). It is the Snakefile's last rule, and
the launcher writes it also after a failed run, to say what failed. Snakemake's HTML report (`workflow.action=report`)
shows the pictures with the stage graph and the stages' run times.
"""
from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

from pipeline.orchestration import runs
from pipeline.orchestration.spec import workflow_from_dict
from pipeline.orchestration.stages import StageSpec
from pipeline.orchestration.status import workflow_status
from pipeline.orchestration.wandb_links import wandb_links

REPORT_DIR = "report"
STAGE_COLUMNS = ("stage", "entry", "state", "seconds", "job", "detail", "wandb", "run_dir")
SCORE_COLUMNS = ("task", "metric", "score", "metrics", "stage", "wandb")


def report_files(root: Path, specs: dict[str, StageSpec]) -> list[str]:
    """What the report writes (the report rule's outputs)."""
    out = Path(root) / REPORT_DIR
    curves = [out / f"curves-{name}.png" for name, spec in specs.items() if spec.entry == "train"]
    return [str(p) for p in (out / "report.md", out / "stages.csv", out / "scores.csv", out / "scores.png", *curves)]


def _scores(specs: dict[str, StageSpec], done: dict[str, str]) -> list[dict]:
    rows = []
    for name, spec in specs.items():
        metrics_file = Path(done.get(name, "/nonexistent")) / "metrics.json"
        if spec.entry != "finetune" or not metrics_file.is_file():
            continue
        record = json.loads(metrics_file.read_text(encoding="utf-8"))
        flat = "; ".join(f"{split} {metric} {value:.4f}" for split, values in record.get("metrics", {}).items()
                         for metric, value in values.items() if isinstance(value, (int, float)))
        rows.append({"task": record.get("task", name), "metric": record.get("main_metric"),
                     "score": f"{record['score']:.4f}", "metrics": flat, "stage": name,
                     "wandb": " ".join(wandb_links(Path(done[name]), Path(done[name]) / "stage.log"))})
    return rows


def _markdown_table(columns, rows) -> list[str]:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        out.append("| " + " | ".join(str(row.get(c, "")).replace("|", "/") for c in columns) + " |")
    return out


def _plot_scores(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4, 1 + len(rows)), 3))
    if rows:
        ax.bar([r["task"] for r in rows], [float(r["score"]) for r in rows])
        ax.set_ylabel("dev score (main metric)")
        for i, row in enumerate(rows):
            ax.annotate(f"{float(row['score']):.3f}\n{row['metric']}", (i, float(row["score"])), ha="center",
                        va="bottom", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no fine-tuning stage finished", ha="center", va="center")
    ax.set_title("Downstream scores")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _copy_curves(name: str, run_dir: str | None, path: Path) -> None:
    source = Path(run_dir) / "curves.png" if run_dir else None
    if source is not None and source.is_file():
        shutil.copyfile(source, path)
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(4, 2))
    ax.text(0.5, 0.5, f"{name}: no curves (not finished, or export.plot=false)", ha="center", va="center")
    ax.axis("off")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(spec_path: Path) -> Path:
    launch = runs.read_json(spec_path)
    workflow = workflow_from_dict(launch["workflow"])
    specs = {name: StageSpec.from_dict(raw) for name, raw in launch["stages"].items()}
    statuses, _ = workflow_status(workflow, specs)
    done = {s.stage: s.run_dir for s in statuses if s.state == "done" and s.run_dir}
    stage_rows = [{"stage": s.stage, "entry": specs[s.stage].entry, "state": s.state,
                   "seconds": f"{s.seconds:.1f}" if s.seconds is not None else "", "job": s.job_id or "",
                   "detail": s.detail, "run_dir": s.run_dir or "",
                   "wandb": " ".join(wandb_links(Path(s.run_dir), Path(s.run_dir) / "stage.log")) if s.run_dir else ""}
                  for s in statuses]
    scores = _scores(specs, done)

    out_dir = workflow.root / REPORT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, columns, rows in (("stages.csv", STAGE_COLUMNS, stage_rows), ("scores.csv", SCORE_COLUMNS, scores)):
        with open(out_dir / name, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
    _plot_scores(scores, out_dir / "scores.png")
    for name, spec in specs.items():
        if spec.entry == "train":
            _copy_curves(name, done.get(name), out_dir / f"curves-{name}.png")
    finished = sum(1 for r in stage_rows if r["state"] == "done")
    group = workflow.wandb_group
    lines = [f"# Workflow {workflow.name}", "",
             f"{finished} of {len(stage_rows)} stages done; outputs in `{workflow.root}`"
             + (f"; W&B group `{group}`" if group else "") + ".", "",
             "## Stages", "", *_markdown_table(STAGE_COLUMNS[:-2], stage_rows), "",
             "## Downstream scores (dev)", ""]
    lines += _markdown_table(SCORE_COLUMNS[:-2] + ("wandb",), scores) if scores else ["No fine-tuning stage finished."]
    data = [f"- {name}: {totals.get('instances', 0):,} instances, {totals.get('documents', 0):,} documents"
            for name, spec in specs.items() if spec.entry == "data_prep" and name in done
            for totals in [json.loads((Path(done[name]) / "manifest.json").read_text()).get("totals", {})]]
    if data:
        lines += ["", "## Data", "", *data]
    (out_dir / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out_dir / "report.md"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path = write_report(Path(argv[0]))
    print(path.read_text(encoding="utf-8"))
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
