"""`workflow.action=status` and `report`: what has run, running nothing: each stage done, stale, queued, running,
failed or not run (from the run records and SLURM's queue), and Snakemake's HTML report of the runs."""
from __future__ import annotations

import socket
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from pipeline.core.app import REPO_ROOT
from pipeline.core.cluster.holder_lock import alive
from pipeline.orchestration import runs
from pipeline.orchestration.launch import job_name_prefix, snakemake, write_launch
from pipeline.orchestration.lock import LaunchLock, describe
from pipeline.orchestration.slurm import QueueError, active_stage_jobs
from pipeline.orchestration.workflow_config import Stage, Workflow, WorkflowError


def html_report(workflow: Workflow, specs: dict[str, Stage]) -> Path:
    """Snakemake's HTML report: the stage graph, run times, and the report rule's scores and pictures."""
    out = workflow.root / "report" / "workflow.html"
    with tempfile.TemporaryDirectory(prefix="workflow-report-") as scratch:
        argv, env = snakemake(write_launch(workflow, specs, REPO_ROOT, Path(scratch)), "--report", str(out))
        result = subprocess.run(argv, env=env, cwd=scratch, capture_output=True, text=True)
    if result.returncode != 0:
        raise WorkflowError(f"snakemake --report failed: {result.stderr.strip()[-2000:]}")
    return out


def stage_status(workflow: Workflow, spec: Stage, active: dict) -> tuple[str, str]:
    stage_dir = workflow.root / spec.name
    if spec.name in active:
        job = active[spec.name]
        return ("running" if job["state"] in ("RUNNING", "COMPLETING") else "queued",
                f"job {job['job_id']} {job['state'].lower()}; log: {workflow.state_dir / 'logs' / spec.name}.log")
    if finished := runs.finished_run(workflow.root, spec.name):
        run_dir, record = finished
        if record.get("identity") != spec.identity:
            return "stale", f"done as {run_dir}, but its config changed since: the next run runs it again"
        attempt = (record.get("attempts") or [{}])[-1]
        took = "".join([f"{attempt['seconds']:.1f} s, " if attempt.get("seconds") is not None else "",
                        f"job {attempt['job_id']}, " if attempt.get("job_id") else ""])
        return "done", f"{took}finished {record.get('finished')}, {run_dir}, code {record.get('code_version')}"
    tried = [(record["attempts"][-1], run_dir) for run_dir, record in runs.runs_of(stage_dir, spec.identity)
             if record.get("attempts")]
    if not tried:
        return "not run", "nothing yet"
    attempt, run_dir = max(tried, key=lambda item: item[0].get("started") or "")
    if attempt.get("exit") is not None:
        return "failed", f"exit status {attempt['exit']}; log: {run_dir / 'stage.log'}"
    if attempt.get("host") == socket.gethostname() and alive(attempt.get("pid")):
        return "running", f"pid {attempt.get('pid')}, {run_dir}"
    return "failed", f"stopped without finishing (killed?); log: {run_dir / 'stage.log'}"


def format_status(workflow: Workflow, specs: dict[str, Stage]) -> str:
    holder, active, unknown = LaunchLock(workflow).holder(), {}, None
    if workflow.launcher == "slurm" or (holder or {}).get("job_id"):
        try:
            active = {job["rule"]: job for job in active_stage_jobs(job_name_prefix(workflow.name, workflow.root))}
        except QueueError as error:
            unknown = f"  (SLURM's queue could not be asked: {error})"
    rows = [(spec.name, *stage_status(workflow, spec, active)) for spec in specs.values() if spec.entry != "report"]
    width = max(len(name) for name, _, _ in rows)
    counts = Counter(state for _, state, _ in rows)
    return "\n".join([f"workflow {workflow.name} in {workflow.root}",
                      *([f"  launched: {describe(holder)}"] if holder else []),
                      *(f"  {name:<{width}}  {state:<8}  {detail}" for name, state, detail in rows),
                      "  " + ", ".join(f"{n} {state}" for state, n in counts.items()), *([unknown] if unknown else [])])
