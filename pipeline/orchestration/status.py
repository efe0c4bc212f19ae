"""`workflow.action=status`: where each stage is, from its sentinel, its run directories' records and, for SLURM,
the queue and the accounting:

    done       its sentinel names a finished run of the stage's current identity (time, run directory)
    stale      done, but its config or code changed since: the next run runs it again
    queued     a SLURM job of it waits (job id)
    running    a SLURM job of it runs (job id), or a local run's process is alive
    failed     its last attempt ended without finishing (exit status, log)
    not run    nothing yet
"""
from __future__ import annotations

import dataclasses
import socket
from pathlib import Path
from typing import Any

from pipeline.orchestration import runs
from pipeline.orchestration.guard import _process_alive, controller_record
from pipeline.orchestration.slurm_jobs import QueueError, accounted_stage_jobs, active_stage_jobs
from pipeline.orchestration.snakemake_cli import SLURM_LOG_DIR, job_name_prefix
from pipeline.orchestration.spec import Workflow
from pipeline.orchestration.stages import StageSpec

FAILED_SLURM_STATES = ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                       "PREEMPTED")


@dataclasses.dataclass(frozen=True)
class StageStatus:
    stage: str
    state: str
    detail: str
    seconds: float | None = None
    job_id: str | None = None
    log: str | None = None
    run_dir: str | None = None


def latest_record(stage_dir: Path, identity: str) -> tuple[Path, dict[str, Any]] | None:
    """The run directory of this identity whose last attempt started last."""
    found = []
    for record_path in stage_dir.glob(f"*/{runs.RECORD}"):
        record = runs.read_json(record_path)
        if record and record.get("identity") == identity and record.get("attempts"):
            found.append((record["attempts"][-1].get("started") or "", record_path.parent, record))
    if not found:
        return None
    _, run_dir, record = max(found, key=lambda item: item[0])
    return run_dir, record


def _slurm_jobs(workflow: Workflow) -> tuple[dict[str, dict], dict[str, dict], str | None]:
    """(rule -> its queued or running job, rule -> its latest accounted job, why they are unknown)."""
    prefix = job_name_prefix(workflow)
    try:
        active = {job["rule"]: job for job in active_stage_jobs(prefix)}
        accounted: dict[str, dict] = {}
        for job in accounted_stage_jobs(workflow.state_dir / SLURM_LOG_DIR):
            accounted[job["rule"]] = job
        return active, accounted, None
    except QueueError as error:
        return {}, {}, str(error)


def stage_status(workflow: Workflow, spec: StageSpec, active: dict, accounted: dict) -> StageStatus:
    stage_dir = workflow.stage_dir(spec.name)
    sentinel = runs.read_json(stage_dir / runs.SENTINEL)
    latest = latest_record(stage_dir, spec.identity)
    if spec.name in active:
        job = active[spec.name]
        state = "running" if job["state"] in ("RUNNING", "COMPLETING") else "queued"
        log = workflow.state_dir / SLURM_LOG_DIR / f"rule_{spec.name}" / f"{job['job_id']}.log"
        return StageStatus(spec.name, state, f"job {job['job_id']} {job['state'].lower()}", job_id=job["job_id"],
                           log=str(log))
    if sentinel is not None:
        record = runs.read_json(Path(sentinel["run_dir"]) / runs.RECORD) or {}
        attempts = record.get("attempts") or [{}]
        seconds = attempts[-1].get("seconds")
        job_id = attempts[-1].get("job_id")
        if sentinel.get("identity") == spec.identity:
            took = (f"{seconds:.1f} s, " if seconds is not None else "") + (f"job {job_id}, " if job_id else "")
            return StageStatus(spec.name, "done", f"{took}finished {record.get('finished')}, {sentinel['run_dir']}",
                               seconds, job_id, run_dir=sentinel["run_dir"])
        return StageStatus(spec.name, "stale", f"done as {sentinel['run_dir']}, but its config or code changed "
                           "since: the next run runs it again", seconds, job_id, run_dir=sentinel["run_dir"])
    if latest is not None:
        run_dir, record = latest
        attempt = record["attempts"][-1]
        log = str(run_dir / "stage.log")
        if attempt.get("exit") is None and not record.get("finished"):
            alive = attempt.get("host") == socket.gethostname() and _process_alive(attempt.get("pid"))
            if alive:
                return StageStatus(spec.name, "running", f"pid {attempt.get('pid')}, {run_dir}", log=log,
                                   run_dir=str(run_dir))
            job = accounted.get(spec.name)
            if job and job["state"] in FAILED_SLURM_STATES:
                slurm_log = workflow.state_dir / SLURM_LOG_DIR / f"rule_{spec.name}" / f"{job['job_id']}.log"
                return StageStatus(spec.name, "failed", f"job {job['job_id']} {job['state'].lower()}; log: {log}, "
                                   f"{slurm_log}", job_id=job["job_id"], log=log, run_dir=str(run_dir))
            return StageStatus(spec.name, "failed", f"stopped without finishing (killed?); log: {log}", log=log,
                               run_dir=str(run_dir))
        if not record.get("finished"):
            return StageStatus(spec.name, "failed", f"exit status {attempt.get('exit')}; log: {log}",
                               attempt.get("seconds"), attempt.get("job_id"), log, str(run_dir))
    job = accounted.get(spec.name)
    if job and job["state"] in FAILED_SLURM_STATES:
        log = workflow.state_dir / SLURM_LOG_DIR / f"rule_{spec.name}" / f"{job['job_id']}.log"
        return StageStatus(spec.name, "failed", f"job {job['job_id']} {job['state'].lower()}; log: {log}",
                           job_id=job["job_id"], log=str(log))
    return StageStatus(spec.name, "not run", "nothing yet")


def workflow_status(workflow: Workflow, specs: dict[str, StageSpec]) -> tuple[list[StageStatus], str | None]:
    """Every stage but the report; and why the SLURM queue could not be asked, if it could not."""
    record = controller_record(workflow) or {}
    active, accounted, unknown = ({}, {}, None)
    if workflow.launcher == "slurm" or record.get("kind") == "slurm":
        active, accounted, unknown = _slurm_jobs(workflow)
    statuses = [stage_status(workflow, spec, active, accounted) for spec in specs.values() if spec.entry != "report"]
    return statuses, unknown


def format_status(workflow: Workflow, statuses: list[StageStatus], unknown: str | None) -> str:
    width = max(len(s.stage) for s in statuses)
    record = controller_record(workflow)
    lines = [f"workflow {workflow.name} in {workflow.root}"]
    if record and not record.get("ended"):
        from pipeline.orchestration.guard import describe
        lines.append(f"  launched: {describe(record)}")
    lines += [f"  {s.stage:<{width}}  {s.state:<8}  {s.detail}" for s in statuses]
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s.state] = counts.get(s.state, 0) + 1
    lines.append("  " + ", ".join(f"{n} {state}" for state, n in counts.items()))
    if unknown:
        lines.append(f"  (SLURM's queue could not be asked: {unknown})")
    return "\n".join(lines)
