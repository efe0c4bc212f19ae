"""The local launcher: the stages in order, each a subprocess of its entry point (stage_job.run_stage), on this
machine. A stage that is done and up to date is skipped; a failed stage stops the stages that need its output (they
are marked cancelled), the others still run, and the report is written last whatever happened."""
from __future__ import annotations

import time
from pathlib import Path

from pipeline.orchestration import markers
from pipeline.orchestration.plan import StagePlan, decide, write_plan
from pipeline.orchestration.spec import Workflow
from pipeline.orchestration.stage_job import run_stage

LOG_DIR = "logs"


def run_locally(workflow: Workflow, plans: dict[str, StagePlan], echo=print) -> int:
    """Returns 0 when every stage is done, 1 otherwise."""
    reasons = decide(workflow, plans)
    plan_path = write_plan(workflow, plans)
    log_dir = workflow.state_dir / LOG_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    failed: set[str] = set()
    width = max(len(name) for name in plans)
    echo(f"workflow {workflow.name}: {len(plans)} stages, outputs in {workflow.root}")
    for name, plan in plans.items():
        blocked = [up for up in plan.upstream if up in failed]
        if blocked:
            markers.write_marker(workflow.state_dir, name, markers.CANCELLED, config_hash=plan.config_hash,
                                 reason=f"not run: stage {', '.join(blocked)} failed")
            failed.add(name)
            echo(f"  {name:<{width}}  cancelled: stage {', '.join(blocked)} failed")
            continue
        if reasons[name] is None:
            echo(f"  {name:<{width}}  skipped: done, same config and inputs")
            continue
        log_path = log_dir / f"{name}.log"
        echo(f"  {name:<{width}}  running ({reasons[name]}); log: {log_path}")
        started = time.perf_counter()
        code = run_stage(plan_path, name, log_path=log_path, under_slurm=False)
        seconds = time.perf_counter() - started
        if code == 0:
            echo(f"  {name:<{width}}  done in {seconds:.1f} s")
            continue
        failed.add(name)
        echo(f"  {name:<{width}}  FAILED after {seconds:.1f} s (exit {code}); log: {log_path}")
        echo(_tail(log_path))
    report = workflow.root / "report" / "report.md"
    if report.is_file():
        echo(f"report: {report}")
    return 1 if failed else 0


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    except FileNotFoundError:
        return ""
    return "\n".join(f"      | {line}" for line in text)
