"""`workflow.action=plan`: what a run would run and why, running nothing: Snakemake's dry run (`snakemake -n`, its own
reason per job) plus what our run records add: the config keys, code and packages changed since a stage ran, a run
that resumes, and on SLURM each stage's sbatch options."""
from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from pipeline.core.app import REPO_ROOT
from pipeline.orchestration import identity, runs
from pipeline.orchestration.launch import snakemake, write_launch
from pipeline.orchestration.slurm import sbatch_line
from pipeline.orchestration.workflow_config import Stage, Workflow, WorkflowError

# Snakemake's reasons for running a job (snakemake.jobs.Reason), in a word
REASONS = {"Missing output files": "missing", "Incomplete output files": "incomplete", "Forced execution": "forced",
           "Updated input files": "an input changed", "Input files updated by another job": "an input stage runs",
           "Set of input files has changed": "its inputs changed", "Params have changed": "params changed"}
JOB = re.compile(r"^(?:local)?rule (\w+):$\n(?:^ +.*\n)*?^ +reason: (.*)$", re.M)


def dry_run(config: Path) -> dict[str, tuple[str, bool]]:
    """rule -> (Snakemake's reason, or 'done, up to date'; whether it runs), from the run's own dry run; a root without
    Snakemake's records yet is looked at from a scratch directory, so that nothing is created there."""
    launch = runs.read_json(config)
    root = Path(launch["workflow"]["root"])
    forced = [name for name, stage in launch["stages"].items() if stage["rerun"]]
    with tempfile.TemporaryDirectory(prefix="workflow-plan-") as scratch:
        argv, env = snakemake(config, "-n", "all", "--cores", "1", *(["--forcerun", *forced] if forced else []),
                              workdir=root if (root / ".snakemake").is_dir() else Path(scratch))
        result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=scratch)
    if result.returncode != 0:
        raise WorkflowError(f"snakemake -n failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    jobs = {rule: ", ".join(REASONS.get(r.split(":")[0].split(" since ")[0], r) for r in reason.split("; "))
            for rule, reason in JOB.findall(result.stdout)}
    return {name: (jobs[name], True) if name in jobs else ("done, up to date", False) for name in launch["stages"]}


def plan(workflow: Workflow, specs: dict[str, Stage]) -> str:
    """Per stage: whether a run would run it and Snakemake's reason, and what changed since it ran."""
    with tempfile.TemporaryDirectory(prefix="workflow-plan-") as scratch:
        config = write_launch(workflow, specs, REPO_ROOT, Path(scratch))
        rows = dry_run(config)
        resources = runs.read_json(config)["rule_resources"]
    width = max(len(name) for name in specs)
    lines = [f"workflow {workflow.name} ({workflow.launcher}), outputs in {workflow.root}"]
    packages = identity.package_versions()
    for name, spec in specs.items():
        reason, runs_it = rows[name]
        notes = [reason]
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
        if moved := [f"{p} {v} -> {packages.get(p)}" for p, v in (ran.get("packages") or {}).items()
                     if packages.get(p) != v]:
            notes.append(f"packages changed since it ran: {', '.join(moved)}")
        lines.append(f"  {name:<{width}}  {'run' if runs_it else 'skip'}: {'; '.join(notes)}")
        if workflow.launcher == "slurm" and name in resources:
            lines.append(f"  {'':<{width}}  sbatch {sbatch_line(resources[name])}")
    lines.append(f"  {sum(runs_it for _, runs_it in rows.values())} of {len(specs)} stages would run")
    return "\n".join(lines)
