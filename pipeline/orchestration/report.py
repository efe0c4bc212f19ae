"""The workflow's final report: every stage's outcome and the downstream scores, as Markdown and CSV.

    python -m pipeline.orchestration.report --plan=<root>/_workflow/plan.json

Writes <root>/report/report.md, stages.csv (stage, entry, state, seconds, job, details, W&B, output) and
scores.csv (task, main metric, score, every dev metric), from the stages' markers and the fine-tuning runs'
metrics.json. Stages that failed or did not run are in the table, with why and where their log is.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from pipeline.orchestration.plan import StagePlan, read_plan
from pipeline.orchestration.spec import STATE_DIR, workflow_from_dict
from pipeline.orchestration.status import workflow_status

STAGE_COLUMNS = ("stage", "entry", "state", "seconds", "job", "detail", "wandb", "output")
SCORE_COLUMNS = ("task", "metric", "score", "metrics", "stage", "wandb")


def _scores(plans: dict[str, StagePlan], markers_by_stage: dict[str, dict]) -> list[dict]:
    rows = []
    for name, plan in plans.items():
        metrics_file = Path(plan.output_dir) / "metrics.json"
        if plan.entry != "finetune" or markers_by_stage.get(name, {}).get("state") != "done" \
                or not metrics_file.is_file():
            continue
        record = json.loads(metrics_file.read_text(encoding="utf-8"))
        flat = "; ".join(f"{split} {metric} {value:.4f}" for split, values in record.get("metrics", {}).items()
                         for metric, value in values.items() if isinstance(value, (int, float)))
        rows.append({"task": record.get("task", plan.task), "metric": record.get("main_metric"),
                     "score": f"{record['score']:.4f}", "metrics": flat, "stage": name,
                     "wandb": " ".join(markers_by_stage[name].get("wandb") or [])})
    return rows


def _data_summary(plans: dict[str, StagePlan]) -> list[str]:
    lines = []
    for name, plan in plans.items():
        manifest = Path(plan.output_dir) / "manifest.json"
        if plan.entry == "data_prep" and manifest.is_file():
            totals = json.loads(manifest.read_text(encoding="utf-8")).get("totals", {})
            lines.append(f"- {name}: {totals.get('instances', 0):,} instances, {totals.get('documents', 0):,} "
                         f"documents, {totals.get('input_tokens', 0):,} input tokens")
    return lines


def _markdown_table(columns, rows) -> list[str]:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        out.append("| " + " | ".join(str(row.get(c, "")).replace("|", "/") for c in columns) + " |")
    return out


def write_report(plan_path: Path) -> Path:
    from pipeline.orchestration import markers

    record, plans = read_plan(plan_path)
    workflow = workflow_from_dict(record["config"])
    state_dir = Path(record["root"]) / STATE_DIR
    statuses = [s for s in workflow_status(workflow, plans) if s.stage in plans and not plans[s.stage].is_report]
    markers_by_stage = {name: markers.read_marker(state_dir, name) or {} for name in plans}
    stage_rows = []
    for status in statuses:
        marker = markers_by_stage[status.stage]
        seconds = marker.get("wall_seconds") if status.state == "done" else None
        stage_rows.append({"stage": status.stage, "entry": plans[status.stage].entry, "state": status.state,
                           "seconds": f"{seconds:.1f}" if seconds is not None else "",
                           "job": status.job_id or "", "detail": status.detail,
                           "wandb": " ".join(marker.get("wandb") or []) if status.state == "done" else "",
                           "output": plans[status.stage].output_dir})
    scores = _scores(plans, markers_by_stage)

    out_dir = next(Path(p.output_dir) for p in plans.values() if p.is_report)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, columns, rows in (("stages.csv", STAGE_COLUMNS, stage_rows), ("scores.csv", SCORE_COLUMNS, scores)):
        with open(out_dir / name, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
    done = sum(1 for r in stage_rows if r["state"] == "done")
    lines = [f"# Workflow {record['workflow']}", "",
             f"{done} of {len(stage_rows)} stages done; outputs in `{record['root']}`"
             + (f"; W&B group `{record['wandb_group']}`" if record.get("wandb_group") else "") + ".", "",
             "## Stages", "", *_markdown_table(STAGE_COLUMNS[:-1], stage_rows), "",
             "## Downstream scores (dev)", ""]
    lines += _markdown_table(SCORE_COLUMNS[:-2] + ("wandb",), scores) if scores else ["No fine-tuning stage finished."]
    data = _data_summary(plans)
    if data:
        lines += ["", "## Data", "", *data]
    (out_dir / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return out_dir / "report.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", required=True, type=Path)
    args = parser.parse_args(argv)
    print(f"report: {write_report(args.plan)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
