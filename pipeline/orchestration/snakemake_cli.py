"""Snakemake's command lines for the workflow: the Snakefile beside this module, the launch's spec, the rerun
triggers, and for SLURM the profile in infra/slurm/snakemake/ plus what depends on the workflow root.

Rerun triggers: `params` (a stage's identity: its composed config and code version), `mtime` (an input sentinel
newer than the output; Snakemake then compares the input's checksum with the one recorded when the stage last ran,
so a sentinel rewritten with the same content re-runs nothing) and `input` (the set of a stage's inputs). Not
`code`: the rules' shell lines only call the stage runner, whose changes shape no result, and not `software-env`
(no conda environments here).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.core.app import REPO_ROOT
from pipeline.orchestration.spec import Workflow

SNAKEFILE = Path(__file__).with_name("Snakefile")
SLURM_PROFILE = REPO_ROOT / "infra" / "slurm" / "snakemake"
RERUN_TRIGGERS = ("params", "mtime", "input")
SLURM_LOG_DIR = "slurm_logs"


def job_name_prefix(workflow: Workflow) -> str:
    """What every SLURM job of this workflow root is named after (the executor appends _<run id>): the workflow's
    name and a hash of its root, so two roots never mistake each other's jobs."""
    root_hash = hashlib.sha256(str(workflow.root).encode()).hexdigest()[:8]
    name = "".join(c if c.isalnum() or c in "_-" else "-" for c in workflow.name)[:30]
    return f"{name}-{root_hash}"


def base_args(workflow: Workflow, spec_path: Path, workdir: Path | None = None) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE),
            "--directory", str(workdir or workflow.root), "--config", f"spec={spec_path}",
            "--rerun-triggers", *RERUN_TRIGGERS]


def run_args(workflow: Workflow, spec_path: Path, executor: str) -> list[str]:
    """Run the workflow: every stage that must run, independent ones going on when one fails (--keep-going; a
    failed stage stops exactly its dependents), outputs of a killed run re-made (--rerun-incomplete)."""
    args = [*base_args(workflow, spec_path), "--keep-going", "--rerun-incomplete", "--printshellcmds"]
    extra = [str(a) for a in workflow.config.get("snakemake_args") or ()]
    if executor == "slurm":
        return [*args, "--profile", str(SLURM_PROFILE), "--slurm-logdir", str(workflow.state_dir / SLURM_LOG_DIR),
                "--slurm-jobname-prefix", job_name_prefix(workflow),
                "--jobs", str(int(workflow.slurm.get("max_jobs", 100))), *extra]
    return [*args, "--cores", str(int(workflow.config.get("local_jobs", 1))), *extra]


def snakemake_env(keep_slurm_conf: bool = True) -> dict[str, str]:
    """The environment Snakemake runs in: this process's, without the SLURM variables of the job it may run in (the
    controller job's geometry must not leak into the stage jobs it submits), but with SLURM_CONF, the client's own
    configuration, which the SLURM executor would drop with them when it finds itself inside a job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    if keep_slurm_conf and os.environ.get("SLURM_CONF"):
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def summary(workflow: Workflow, spec_path: Path) -> dict[str, tuple[str, bool]]:
    """rule -> (Snakemake's status of its output, whether it runs), without running anything: Snakemake's
    --summary. A root without Snakemake's records yet is looked at from a scratch directory, so that nothing is
    created there."""
    scratch = None
    workdir = workflow.root
    if not (workflow.root / ".snakemake").is_dir():
        scratch = tempfile.TemporaryDirectory(prefix="workflow-plan-")
        workdir = Path(scratch.name)
    try:
        result = subprocess.run([*base_args(workflow, spec_path, workdir), "--summary", "--quiet", "all",
                                 "--cores", "1"], capture_output=True, text=True, env=snakemake_env(), cwd=REPO_ROOT)
    finally:
        if scratch is not None:
            scratch.cleanup()
    if result.returncode != 0:
        raise RuntimeError(f"snakemake --summary failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    rows: dict[str, tuple[str, bool]] = {}
    header = None
    for line in result.stdout.splitlines():
        fields = line.split("\t")
        if fields[0] == "output_file":
            header = fields
            continue
        if header is None or len(fields) != len(header):
            continue
        row = dict(zip(header, fields))
        runs = row["plan"] == "update pending"
        previous = rows.get(row["rule"])
        if previous is None or runs:
            rows[row["rule"]] = (row["status"], runs)
    return rows
