"""`workflow.action=status`: where each stage is, from its sentinel and run records and, on SLURM, the queue: done (its
sentinel names a finished run of its current config), stale (done, but its config changed since), queued or running
(a SLURM job, or a local run's live process), failed (its last attempt ended without finishing: exit status, log),
not run."""
from __future__ import annotations

import socket

from pipeline.orchestration import runs
from pipeline.orchestration.launch import job_name_prefix
from pipeline.orchestration.lock import LaunchLock, alive, describe
from pipeline.orchestration.slurm_jobs import QueueError, active_stage_jobs
from pipeline.orchestration.spec import Workflow
from pipeline.orchestration.stages import StageSpec


def stage_status(workflow: Workflow, spec: StageSpec, active: dict) -> tuple[str, str]:
    stage_dir = workflow.root / spec.name
    if spec.name in active:
        job = active[spec.name]
        return ("running" if job["state"] in ("RUNNING", "COMPLETING") else "queued",
                f"job {job['job_id']} {job['state'].lower()}; log: {workflow.state_dir / 'logs' / spec.name}.log")
    if runs.read_json(stage_dir / runs.SENTINEL) is not None:
        run_dir = (stage_dir / runs.CURRENT).resolve()
        record = runs.read_json(run_dir / runs.RECORD) or {}
        if record.get("identity") != spec.identity:
            return "stale", f"done as {run_dir}, but its config changed since: the next run runs it again"
        attempt = (record.get("attempts") or [{}])[-1]
        took = "".join([f"{attempt['seconds']:.1f} s, " if attempt.get("seconds") is not None else "",
                        f"job {attempt['job_id']}, " if attempt.get("job_id") else ""])
        return "done", f"{took}finished {record.get('finished')}, {run_dir}, code {record.get('code_version')}"
    tried = [(r["attempts"][-1], path.parent) for path in stage_dir.glob(f"*/{runs.RECORD}")
             if not path.parent.is_symlink() and (r := runs.read_json(path) or {}).get("identity") == spec.identity
             and r.get("attempts")]
    if not tried:
        return "not run", "nothing yet"
    attempt, run_dir = max(tried, key=lambda item: item[0].get("started") or "")
    if attempt.get("exit") is not None:
        return "failed", f"exit status {attempt['exit']}; log: {run_dir / 'stage.log'}"
    if attempt.get("host") == socket.gethostname() and alive(attempt.get("pid")):
        return "running", f"pid {attempt.get('pid')}, {run_dir}"
    return "failed", f"stopped without finishing (killed?); log: {run_dir / 'stage.log'}"


def format_status(workflow: Workflow, specs: dict[str, StageSpec]) -> str:
    holder, active, unknown = LaunchLock(workflow).holder(), {}, None
    if workflow.launcher == "slurm" or (holder or {}).get("job_id"):
        try:
            active = {job["rule"]: job for job in active_stage_jobs(job_name_prefix(workflow.name, workflow.root))}
        except QueueError as error:
            unknown = f"  (SLURM's queue could not be asked: {error})"
    rows = [(spec.name, *stage_status(workflow, spec, active)) for spec in specs.values() if spec.entry != "report"]
    width = max(len(name) for name, _, _ in rows)
    counts: dict[str, int] = {}
    for _, state, _ in rows:
        counts[state] = counts.get(state, 0) + 1
    return "\n".join([f"workflow {workflow.name} in {workflow.root}",
                      *([f"  launched: {describe(holder)}"] if holder else []),
                      *(f"  {name:<{width}}  {state:<8}  {detail}" for name, state, detail in rows),
                      "  " + ", ".join(f"{n} {state}" for state, n in counts.items()), *([unknown] if unknown else [])])
