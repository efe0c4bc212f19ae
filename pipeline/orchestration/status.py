"""`workflow.action=status`: where each stage is (done, running, pending, failed, cancelled), from its marker and,
for SLURM jobs, from squeue (a job that left the queue without writing done has failed or was cancelled)."""
from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
from pathlib import Path

from pipeline.orchestration import markers
from pipeline.orchestration.plan import StagePlan, consumed_inputs
from pipeline.orchestration.spec import Workflow


@dataclasses.dataclass(frozen=True)
class StageStatus:
    stage: str
    state: str          # done | running | pending | failed | cancelled
    detail: str
    job_id: str | None = None
    log: str | None = None


def queued_jobs() -> dict[str, tuple[str, str]] | None:
    """job id (array tasks as <job>_<task>) -> (state, reason) for every job in the queue; None without squeue."""
    if shutil.which("squeue") is None:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T|%r"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    jobs = {}
    for line in out.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            jobs[parts[0]] = (parts[1], parts[2])
    return jobs


def _process_alive(pid: int | None, host: str | None) -> bool:
    if not pid or host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stage_status(workflow: Workflow, plan: StagePlan, queue: dict[str, tuple[str, str]] | None,
                 earlier: dict[str, StageStatus]) -> StageStatus:
    marker = markers.read_marker(workflow.state_dir, plan.name)
    if marker is None:
        return StageStatus(plan.name, "pending", "not run yet")
    state, job, log = marker.get("state"), marker.get("job_id"), marker.get("log")
    in_queue = queue.get(job) if (queue is not None and job) else None
    failed_upstream = [up for up in plan.upstream if earlier.get(up) and earlier[up].state in ("failed", "cancelled")]

    if state == markers.DONE:
        if markers.is_up_to_date(marker, plan.config_hash, Path(plan.output_dir), plan.complete_when,
                                 consumed_inputs(workflow.state_dir, plan)) or plan.is_report:
            seconds = marker.get("wall_seconds")
            return StageStatus(plan.name, "done", f"{seconds:.1f} s, finished {marker.get('finished_at')}"
                               if seconds is not None else "done", job, log)
        return StageStatus(plan.name, "pending", "done before, but its config, inputs or outputs changed since: "
                           "the next run runs it again", job, log)
    if state in (markers.SUBMITTED, markers.RUNNING, markers.INTERRUPTED) and job:
        if in_queue is not None:
            slurm_state, reason = in_queue
            if slurm_state in ("RUNNING", "COMPLETING"):
                return StageStatus(plan.name, "running", f"job {job}", job, log)
            note = " (requeued; resumes from its checkpoint)" if state == markers.INTERRUPTED else ""
            return StageStatus(plan.name, "pending", f"job {job} {slurm_state.lower()}{note}"
                               + (f", {reason}" if reason and reason != "None" else ""), job, log)
        if queue is None:
            return StageStatus(plan.name, "running" if state == markers.RUNNING else "pending",
                               f"job {job} (squeue is not available here to check it)", job, log)
    if state == markers.SUBMITTED:
        if failed_upstream:
            return StageStatus(plan.name, "cancelled", f"not run: stage {', '.join(failed_upstream)} did not "
                               f"finish (job {job} was cancelled by SLURM)", job, log)
        return StageStatus(plan.name, "failed", f"job {job} left the queue before the stage started (cancelled?); "
                           f"log: {log}", job, log)
    if state == markers.RUNNING:
        if not job and _process_alive(marker.get("pid"), marker.get("host")):
            return StageStatus(plan.name, "running", f"pid {marker.get('pid')} on {marker.get('host')}", None, log)
        where = f"job {job}" if job else f"pid {marker.get('pid')}"
        return StageStatus(plan.name, "failed", f"{where} ended without finishing (killed, time limit or node "
                           f"failure); log: {log}", job, log)
    if state == markers.INTERRUPTED:
        return StageStatus(plan.name, "failed", f"interrupted ({marker.get('reason')}); the next run resumes it; "
                           f"log: {log}", job, log)
    if state == markers.CANCELLED:
        return StageStatus(plan.name, "cancelled", marker.get("reason") or "cancelled", job, log)
    return StageStatus(plan.name, "failed", f"{marker.get('reason') or 'failed'}; log: {log}", job, log)


def workflow_status(workflow: Workflow, plans: dict[str, StagePlan]) -> list[StageStatus]:
    queue = queued_jobs()
    found: dict[str, StageStatus] = {}
    for name, plan in plans.items():
        found[name] = stage_status(workflow, plan, queue, found)
    return list(found.values())


def format_status(workflow: Workflow, statuses: list[StageStatus]) -> str:
    width = max(len(s.stage) for s in statuses)
    lines = [f"workflow {workflow.name} in {workflow.root}"]
    lines += [f"  {s.stage:<{width}}  {s.state:<9}  {s.detail}" for s in statuses]
    counts = {}
    for s in statuses:
        counts[s.state] = counts.get(s.state, 0) + 1
    lines.append("  " + ", ".join(f"{n} {state}" for state, n in counts.items()))
    return "\n".join(lines)
