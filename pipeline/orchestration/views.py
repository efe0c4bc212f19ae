"""What `python pipeline/workflow.py` shows, running nothing:

    plan     per stage, Snakemake's own status of its output (--summary), what changed since it ran (config keys,
             code, packages) and, for SLURM, its sbatch options
    status   where each stage is, from its sentinel and run records and, on SLURM, the queue: done (its sentinel names
             a finished run of its current config), stale (done, but its config changed since), queued or running (a
             SLURM job, or a local run's live process), failed (its last attempt ended without finishing: exit status,
             log), not run
    report   Snakemake's HTML report (stage graph, run times, the report rule's scores and pictures)
"""
from __future__ import annotations

import socket
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from pipeline.core.app import REPO_ROOT
from pipeline.orchestration import identity, runs
from pipeline.orchestration.launch import job_name_prefix, snakemake, write_launch
from pipeline.orchestration.lock import LaunchLock, alive, describe
from pipeline.orchestration.slurm import QueueError, active_stage_jobs, sbatch_line
from pipeline.orchestration.spec import Stage, Workflow, WorkflowError


def summary(config: Path) -> dict[str, tuple[str, bool]]:
    """rule -> (Snakemake's status of its output, whether it runs): Snakemake's --summary, which runs nothing. A
    root without Snakemake's records yet is looked at from a scratch directory, so that nothing is created there."""
    root = Path(runs.read_json(config)["workflow"]["root"])
    with tempfile.TemporaryDirectory(prefix="workflow-plan-") as scratch:
        argv, env = snakemake(config, "--summary", "--quiet", "all", "--cores", "1",
                              workdir=root if (root / ".snakemake").is_dir() else Path(scratch))
        result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=scratch)
    if result.returncode != 0:
        raise WorkflowError(f"snakemake --summary failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    rows: dict[str, tuple[str, bool]] = {}
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    header = next((fields for fields in lines if fields[0] == "output_file"), [])
    for row in (dict(zip(header, fields)) for fields in lines if header and len(fields) == len(header)):
        if row["rule"] not in rows or row["plan"] == "update pending":
            rows[row["rule"]] = (row["status"], row["plan"] == "update pending")
    return rows


def plan(workflow: Workflow, specs: dict[str, Stage]) -> str:
    """Per stage: whether a run would run it and Snakemake's reason, and what changed since it ran."""
    with tempfile.TemporaryDirectory(prefix="workflow-plan-") as scratch:
        config = write_launch(workflow, specs, REPO_ROOT, Path(scratch))
        rows = summary(config)
        resources = runs.read_json(config)["rule_resources"]
    width = max(len(name) for name in specs)
    lines = [f"workflow {workflow.name} ({workflow.launcher}), outputs in {workflow.root}"]
    packages = identity.package_versions()
    for name, spec in specs.items():
        status, runs_it = rows.get(name, ("missing", True))
        notes = [{("ok", True): "an input stage runs", ("ok", False): "done, up to date"}.get((status, runs_it),
                                                                                                status)]
        ran = runs.read_json(workflow.root / name / runs.CURRENT / runs.RECORD) or {}
        if ran and ran.get("identity") != spec.identity:
            changed = identity.changed_keys(ran.get("document") or {}, spec.document)
            notes.append(f"config changed since it ran: {', '.join(changed)} (a new run directory; "
                         f"{(workflow.root / name / runs.CURRENT).resolve()} is kept)")
        unfinished = [run_dir for run_dir, record in runs.runs_of(workflow.root / name, spec.identity)
                      if not record.get("finished")]
        if unfinished and runs_it:
            notes.append(f"its run {unfinished[0]} did not finish: it resumes there")
        if ran.get("code_version") and ran["code_version"] != spec.code_version:
            notes.append(f"code changed since it ran ({ran['code_version']} -> {spec.code_version}): "
                         + ("it runs again on it" if spec.rerun else
                            f"to run it again on it, workflow.rerun_code_changed=[{name}]"))
        moved = [f"{p} {v} -> {packages.get(p)}" for p, v in (ran.get("packages") or {}).items()
                 if packages.get(p) != v]
        if moved:
            notes.append(f"packages changed since it ran: {', '.join(moved)}")
        lines.append(f"  {name:<{width}}  {'run' if runs_it else 'skip'}: {'; '.join(notes)}")
        if workflow.launcher == "slurm" and name in resources:
            lines.append(f"  {'':<{width}}  sbatch {sbatch_line(resources[name])}")
    lines.append(f"  {sum(runs_it for _, runs_it in rows.values())} of {len(specs)} stages would run")
    return "\n".join(lines)


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
    if runs.read_json(stage_dir / runs.SENTINEL) is not None:
        run_dir = (stage_dir / runs.CURRENT).resolve()
        record = runs.read_json(run_dir / runs.RECORD) or {}
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
