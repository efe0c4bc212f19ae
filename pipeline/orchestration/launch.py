"""What `python pipeline/workflow.py` does for each action, once every stage is composed and checked:

    run, local   Snakemake here, holding the launch lock until it ends (Ctrl-C stops it and every running stage)
    run, slurm   the controller (Snakemake with the SLURM executor) submitted as a small SLURM job; returns at once
    plan         Snakemake's summary: per stage, whether it runs and why; nothing runs, no output is touched
    status       status.py
    report       the report (report.py) and Snakemake's HTML report beside it

Each launch writes its spec, the stages as composed here, to <root>/_workflow/launches/<time>.json; Snakemake and
the stage jobs read that file, so a queued job runs what this launch planned.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.core.app import REPO_ROOT
from pipeline.orchestration import guard, identity, runs
from pipeline.orchestration.report import report_files, write_report
from pipeline.orchestration.snakemake_cli import (base_args, job_name_prefix, run_args, snakemake_env,
                                                  summary)
from pipeline.orchestration.spec import REPORT_STAGE, Workflow, WorkflowError
from pipeline.orchestration.stages import StageSpec

LAUNCH_DIR = "launches"
LOG_DIR = "logs"
HTML_REPORT = "workflow.html"


def launch_record(workflow: Workflow, specs: dict[str, StageSpec]) -> dict:
    return {"root": str(workflow.root), "workflow": workflow.config, "retries": workflow.retries,
            "slurm": workflow.slurm, "created": runs.now(),
            "stages": {name: dataclasses.asdict(spec) for name, spec in specs.items()},
            "report": report_files(workflow.root, specs) if REPORT_STAGE in specs else []}


def write_launch(workflow: Workflow, specs: dict[str, StageSpec], directory: Path | None = None) -> Path:
    directory = directory or workflow.state_dir / LAUNCH_DIR
    stamp = runs.now().replace(":", "").replace("-", "")[:15]
    path = directory / f"{stamp}-{os.getpid()}.json"
    runs.write_json(path, launch_record(workflow, specs))
    return path


def run_local(workflow: Workflow, specs: dict[str, StageSpec]) -> int:
    with guard.LaunchLock(workflow):
        guard.check_no_live_controller(workflow)
        spec_path = write_launch(workflow, specs)
        env = snakemake_env()
        guard.release_stale_snakemake_lock(workflow, base_args(workflow, spec_path), env)
        record = guard.write_controller_record(workflow, kind="local", host=socket.gethostname(), pid=os.getpid(),
                                               started=runs.now(), spec=str(spec_path))
        print(f"workflow {workflow.name}: {len(specs)} stages, outputs in {workflow.root}", flush=True)
        code = run_snakemake(run_args(workflow, spec_path, "local"), env)
        finish(workflow, spec_path, code, record)
        return code


def run_snakemake(argv: list[str], env: dict[str, str]) -> int:
    """Snakemake as a child in this terminal's process group: Ctrl-C reaches it (it stops its running stages and
    exits) and this process waits for it rather than dying first."""
    child = subprocess.Popen(argv, env=env, cwd=REPO_ROOT)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return child.wait()
    finally:
        signal.signal(signal.SIGINT, previous)


def finish(workflow: Workflow, spec_path: Path, code: int, record: dict) -> None:
    """After a run: the report says what failed when Snakemake could not write it; the record says it ended."""
    if code != 0 and (runs.read_json(spec_path) or {}).get("report"):
        path = write_report(spec_path)
        print(f"workflow {workflow.name}: Snakemake exited with status {code}; report: {path}", flush=True)
    guard.write_controller_record(workflow, **{**record, "ended": runs.now(), "exit": code})
    print(f"status: python pipeline/workflow.py +workflow={workflow.name} workflow.root={workflow.root} "
          "workflow.action=status", flush=True)


def submit_controller(workflow: Workflow, specs: dict[str, StageSpec]) -> int:
    """The controller as a SLURM job of its own (controller.py): no login shell has to stay open for days."""
    controller = dict(workflow.slurm.get("controller") or {})
    with guard.LaunchLock(workflow):
        guard.check_no_live_controller(workflow)
        spec_path = write_launch(workflow, specs)
        log_dir = workflow.state_dir / LOG_DIR
        log_dir.mkdir(parents=True, exist_ok=True)
        command = f"exec {shlex.quote(sys.executable)} -m pipeline.orchestration.controller {shlex.quote(str(spec_path))}"
        argv = ["sbatch", "--parsable", f"--job-name={job_name_prefix(workflow)}-controller",
                f"--output={log_dir}/controller-%j.log", "--open-mode=append", f"--chdir={REPO_ROOT}",
                f"--time={controller.get('time', '7-00:00:00')}", f"--cpus-per-task={controller.get('cpus', 1)}",
                f"--mem={controller.get('mem', '4G')}", "--requeue",
                f"--signal=B:USR1@{int(controller.get('requeue_lead_s', 300))}"]
        for key in ("partition", "account"):
            value = controller.get(key) or workflow.slurm.get(key)
            if value:
                argv.append(f"--{key}={value}")
        argv += ["--wrap", command]
        env = {**os.environ, "PYTHONPATH": snakemake_env()["PYTHONPATH"]}
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        if result.returncode != 0:
            raise WorkflowError(f"sbatch refused the controller job: {result.stderr.strip()}")
        job_id = result.stdout.strip().split(";")[0]
        log = log_dir / f"controller-{job_id}.log"
        guard.write_controller_record(workflow, kind="slurm", job_id=job_id, submitted=runs.now(), log=str(log),
                                      spec=str(spec_path))
    print(f"workflow {workflow.name}: controller job {job_id} submitted; it runs the stages as SLURM jobs.\n"
          f"  log:    tail -f {log}\n  status: python pipeline/workflow.py +workflow={workflow.name} "
          f"workflow.root={workflow.root} workflow.action=status\n  stop:   scancel {job_id}   (cancels its stage jobs)")
    return 0


def check_slurm_tools() -> None:
    missing = [tool for tool in ("sbatch", "squeue", "sacct") if shutil.which(tool) is None]
    if missing:
        raise WorkflowError(f"workflow.launcher=slurm, but {', '.join(missing)} not on the PATH: run this on a SLURM "
                            "login node (or install the SLURM client), or use workflow.launcher=local")


def plan(workflow: Workflow, specs: dict[str, StageSpec]) -> str:
    """Per stage: whether a run would run it, and why. The spec goes to a temporary file: nothing under the
    workflow root but Snakemake's own log and file inventory (<root>/.snakemake) is written."""
    with tempfile.TemporaryDirectory(prefix="workflow-plan-") as scratch:
        spec_path = write_launch(workflow, specs, Path(scratch))
        rows = summary(workflow, spec_path)
    runs_now = {name for name, (_, runs_it) in rows.items() if runs_it}
    width = max(len(name) for name in specs)
    lines = [f"workflow {workflow.name} ({workflow.launcher}), outputs in {workflow.root}"]
    for name, spec in specs.items():
        status, runs_it = rows.get(name, ("missing", True))
        reason = why(workflow, spec, status, runs_now) if runs_it else "done, up to date"
        lines.append(f"  {name:<{width}}  {'run' if runs_it else 'skip'}: {reason}")
    lines.append(f"  {len(runs_now)} of {len(specs)} stages would run")
    return "\n".join(lines)


def why(workflow: Workflow, spec: StageSpec, status: str, runs_now: set[str]) -> str:
    if spec.entry == "report":
        return "a stage it reports on runs" if runs_now - {spec.name} else f"report files: {status}"
    sentinel = runs.read_json(runs.sentinel_path(workflow.root, spec.name))
    if sentinel is None:
        tried = [r for r in map(runs.read_json, workflow.stage_dir(spec.name).glob(f"*/{runs.RECORD}"))
                 if r and r.get("identity") == spec.identity and not r.get("finished")]
        return "its last run did not finish (a pre-training resumes from its checkpoint)" if tried else "not run yet"
    if sentinel.get("identity") != spec.identity:
        record = runs.read_json(Path(sentinel["run_dir"]) / runs.RECORD) or {}
        changed = identity.changed_keys(record.get("document") or {}, spec.document)
        return f"its config or code changed: {', '.join(changed) or 'identity'} (a new run directory; " \
               f"{sentinel['run_dir']} is kept)"
    upstream = [up for up in spec.upstream if up in runs_now]
    if upstream:
        return f"its input stage {', '.join(upstream)} runs"
    return {"updated input files": "an input's content changed since it ran"}.get(status, status)


def html_report(workflow: Workflow, spec_path: Path) -> Path:
    """Snakemake's HTML report: the stage graph, run times, and the report's pictures and tables."""
    out = workflow.root / "report" / HTML_REPORT
    result = subprocess.run([*base_args(workflow, spec_path), "--report", str(out)], env=snakemake_env(),
                            cwd=REPO_ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise WorkflowError(f"snakemake --report failed: {result.stderr.strip()[-2000:]}")
    return out
