"""`workflow.action=status`: where each stage is, from its sentinel and run records and, on SLURM, the queue:

    done       its sentinel names a finished run of the stage's current config (time, run directory, code version)
    stale      done, but its config changed since: the next run runs it again
    queued     a SLURM job of it waits (job id)
    running    a SLURM job of it runs (job id), or a local run's process is alive
    failed     its last attempt ended without finishing (exit status, log)
    not run    nothing yet
"""
from __future__ import annotations

import socket
from pathlib import Path

from pipeline.orchestration import runs
from pipeline.orchestration.launch import job_name_prefix
from pipeline.orchestration.lock import LaunchLock, _alive, describe
from pipeline.orchestration.slurm_jobs import QueueError, active_stage_jobs
from pipeline.orchestration.spec import Workflow
from pipeline.orchestration.stages import StageSpec


def stage_status(workflow: Workflow, spec: StageSpec, active: dict) -> tuple[str, str, str | None]:
    """(state, details, run directory)."""
    stage_dir = workflow.root / spec.name
    if spec.name in active:
        job = active[spec.name]
        return ("running" if job["state"] in ("RUNNING", "COMPLETING") else "queued",
                f"job {job['job_id']} {job['state'].lower()}; log: {workflow.state_dir / 'logs' / spec.name}.log", None)
    records = [(r.parent, runs.read_json(r) or {}) for r in stage_dir.glob(f"*/{runs.RECORD}")
               if not r.parent.is_symlink()]
    if runs.read_json(stage_dir / runs.SENTINEL) is not None:
        run_dir = (stage_dir / runs.CURRENT).resolve()
        record = runs.read_json(run_dir / runs.RECORD) or {}
        attempt = (record.get("attempts") or [{}])[-1]
        if record.get("identity") == spec.identity:
            took = f"{attempt['seconds']:.1f} s, " if attempt.get("seconds") is not None else ""
            took += f"job {attempt['job_id']}, " if attempt.get("job_id") else ""
            return ("done", f"{took}finished {record.get('finished')}, {run_dir}, code {record.get('code_version')}",
                    str(run_dir))
        return "stale", f"done as {run_dir}, but its config changed since: the next run runs it again", str(run_dir)
    mine = [(r["attempts"][-1], d) for d, r in records if r.get("identity") == spec.identity and r.get("attempts")]
    if not mine:
        return "not run", "nothing yet", None
    attempt, run_dir = max(mine, key=lambda item: item[0].get("started") or "")
    log = run_dir / "stage.log"
    if attempt.get("exit") is None:
        if attempt.get("host") == socket.gethostname() and _alive(attempt.get("pid")):
            return "running", f"pid {attempt.get('pid')}, {run_dir}", str(run_dir)
        return "failed", f"stopped without finishing (killed?); log: {log}", str(run_dir)
    return "failed", f"exit status {attempt['exit']}; log: {log}", str(run_dir)


def workflow_status(workflow: Workflow, specs: dict[str, StageSpec]) -> list[tuple[str, str, str, str | None]]:
    """(stage, state, details, run directory) of every stage but the report."""
    active, unknown = {}, None
    holder = LaunchLock(workflow).holder() or {}
    if workflow.launcher == "slurm" or holder.get("job_id"):
        try:
            active = {job["rule"]: job for job in active_stage_jobs(job_name_prefix(workflow.name, workflow.root))}
        except QueueError as error:
            unknown = str(error)
    rows = [(spec.name, *stage_status(workflow, spec, active)) for spec in specs.values() if spec.entry != "report"]
    return rows + ([("(SLURM)", "unknown", f"the queue could not be asked: {unknown}", None)] if unknown else [])


def format_status(workflow: Workflow, rows: list) -> str:
    width = max(len(row[0]) for row in rows)
    holder = LaunchLock(workflow).holder()
    lines = [f"workflow {workflow.name} in {workflow.root}"]
    lines += [f"  launched: {describe(holder)}"] if holder else []
    lines += [f"  {stage:<{width}}  {state:<8}  {detail}" for stage, state, detail, _ in rows]
    counts: dict[str, int] = {}
    for _, state, _, _ in rows:
        counts[state] = counts.get(state, 0) + 1
    return "\n".join([*lines, "  " + ", ".join(f"{n} {state}" for state, n in counts.items())])


def done_run_dirs(workflow: Workflow, specs: dict[str, StageSpec]) -> dict[str, Path]:
    return {stage: Path(run_dir) for stage, state, _, run_dir in workflow_status(workflow, specs) if state == "done"}
