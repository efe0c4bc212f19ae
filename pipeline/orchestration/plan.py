"""The resolved workflow: each stage's command, hash and outputs, and which stages must run now, and why.

The plan is written to <root>/_workflow/plan.json (and a copy per SLURM submission, which that submission's jobs
read, so that a later re-run with another config cannot change what a queued job does).
"""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from pipeline.orchestration import markers
from pipeline.orchestration.entries import check_entry_configs, stage_command
from pipeline.orchestration.spec import REPORT_STAGE, Workflow

PLAN_FILE = "plan.json"


@dataclasses.dataclass
class StagePlan:
    name: str
    entry: str
    argv: list[str]
    env: dict[str, str]
    output_dir: str
    complete_when: list[str]
    upstream: list[str]
    config_hash: str
    parallel_ranks: bool
    resources: dict[str, Any]
    task: str | None
    group: str | None

    @property
    def is_report(self) -> bool:
        return self.entry == "report"


def build_plan(workflow: Workflow, check_configs: bool = True) -> dict[str, StagePlan]:
    python = os.environ.get("WORKFLOW_PYTHON") or sys.executable
    commands = {stage.name: stage_command(workflow, stage, python) for stage in workflow.stages}
    if check_configs:
        check_entry_configs(workflow, commands)
    plans: dict[str, StagePlan] = {}
    for stage in workflow.stages:
        command = commands[stage.name]
        upstream = list(stage.upstream)
        plans[stage.name] = StagePlan(
            name=stage.name, entry=stage.entry, argv=list(command.argv), env=dict(workflow.env),
            output_dir=str(command.output_dir), complete_when=list(command.complete_when), upstream=upstream,
            config_hash=markers.stage_hash(command.argv, workflow.env,
                                           {up: plans[up].config_hash for up in upstream}),
            parallel_ranks=command.parallel_ranks, resources=dataclasses.asdict(stage.resources), task=stage.task,
            group=stage.group)
    return plans


def plan_record(workflow: Workflow, plans: dict[str, StagePlan]) -> dict[str, Any]:
    return {"workflow": workflow.name, "root": str(workflow.root), "launcher": workflow.launcher,
            "wandb_group": workflow.wandb_group, "created_at": markers.now(), "config": workflow.config,
            "stages": [dataclasses.asdict(p) for p in plans.values()]}


def write_plan(workflow: Workflow, plans: dict[str, StagePlan], name: str = PLAN_FILE) -> Path:
    path = workflow.state_dir / name
    markers.write_json_atomically(path, plan_record(workflow, plans))
    return path


def read_plan(path: Path) -> tuple[dict[str, Any], dict[str, StagePlan]]:
    import json

    record = json.loads(Path(path).read_text(encoding="utf-8"))
    return record, {s["name"]: StagePlan(**s) for s in record["stages"]}


def consumed_inputs(state_dir: Path, plan: StagePlan) -> dict[str, str | None]:
    """The run of each input that exists now (its done marker's run_id; None if it has none)."""
    consumed = {}
    for up in plan.upstream:
        marker = markers.read_marker(state_dir, up)
        consumed[up] = marker.get("run_id") if marker and marker.get("state") == markers.DONE else None
    return consumed


def decide(workflow: Workflow, plans: dict[str, StagePlan]) -> dict[str, str | None]:
    """stage -> why it must run now (None: it is done and up to date, so it is skipped). A stage runs when it is not
    done for its current hash, or when a stage it reads runs (it will consume a new output)."""
    reasons: dict[str, str | None] = {}
    for name, plan in plans.items():
        if plan.is_report:
            reasons[name] = "the report is written on every run"
            continue
        marker = markers.read_marker(workflow.state_dir, name)
        rerun_upstream = [up for up in plan.upstream if reasons.get(up)]
        if rerun_upstream:
            reasons[name] = f"its input stage {', '.join(rerun_upstream)} runs"
        elif marker is None:
            reasons[name] = "never run"
        elif marker.get("state") != markers.DONE:
            reasons[name] = f"last {marker.get('state')}"
        elif marker.get("config_hash") != plan.config_hash:
            reasons[name] = "its config or inputs changed"
        elif not markers.outputs_complete(Path(plan.output_dir), plan.complete_when):
            reasons[name] = "its outputs are incomplete"
        elif not markers.is_up_to_date(marker, plan.config_hash, Path(plan.output_dir), plan.complete_when,
                                       consumed_inputs(workflow.state_dir, plan)):
            reasons[name] = "an input was produced again since"
        else:
            reasons[name] = None
    return reasons


def report_upstream(plans: dict[str, StagePlan]) -> list[str]:
    """The report waits for every other stage."""
    return [name for name in plans if name != REPORT_STAGE]
