"""What `python pipeline/workflow.py` does for each action, once every stage is composed and checked:

    run, local   Snakemake here, holding the launch lock until it ends (Ctrl-C stops it and every running stage)
    run, slurm   the controller (Snakemake with the SLURM executor) submitted as a small SLURM job; returns at once
    plan         per stage, Snakemake's own status of its output (--summary), what changed since it ran (config
                 keys, code, packages) and, for SLURM, its sbatch options; nothing runs
    report       Snakemake's HTML report (stage graph, run times, the report rule's scores and pictures)

A run writes the launch's config, the stages as composed here, to <root>/_workflow/launches/<time>.json and takes a
snapshot of the code (snapshot.py); Snakemake and every stage job read that config and run that code.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.core.app import REPO_ROOT
from pipeline.orchestration import identity, runs
from pipeline.orchestration.lock import LaunchLock
from pipeline.orchestration.report import report_files
from pipeline.orchestration.slurm_resources import rule_resources, sbatch_line
from pipeline.orchestration.snapshot import take_snapshot
from pipeline.orchestration.spec import REPORT_STAGE, STATE_DIR, Workflow, WorkflowError
from pipeline.orchestration.stages import StageSpec

SLURM_LOG_DIR = "slurm_logs"


def job_name_prefix(name: str, root: str | Path) -> str:
    """What every SLURM job of this workflow root is named after (the executor appends _<run id>): the workflow's
    name and a hash of its resolved root, so two roots never mistake each other's jobs."""
    return f"{name[:30]}-{hashlib.sha256(str(root).encode()).hexdigest()[:8]}"


def write_launch(workflow: Workflow, specs: dict[str, StageSpec], code: Path, directory: Path | None = None) -> Path:
    """The launch's Snakemake config file."""
    record = {"workflow": workflow.config, "code": str(code), "executor": workflow.launcher, "created": runs.now(),
              "stages": {name: dataclasses.asdict(spec) for name, spec in specs.items()},
              "rule_resources": {name: rule_resources(spec.resources, spec.entry, workflow.slurm)
                                 for name, spec in specs.items() if spec.entry != REPORT_STAGE},
              "report": report_files(workflow.root, specs) if REPORT_STAGE in specs else []}
    stamp = record["created"][:19].replace(":", "").replace("-", "")
    path = (directory or workflow.state_dir / "launches") / f"{stamp}-{os.getpid()}.json"
    runs.write_json(path, record)
    return path


def snakemake(config: Path, *args: str, workdir: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """Snakemake on the launch's config, from its code snapshot, and its environment: this process's without the
    SLURM variables of the job it may run in (the controller's geometry must not leak into the stage jobs), but with
    SLURM_CONF, which the executor would drop with them."""
    launch = runs.read_json(config)
    code = Path(launch["code"])
    argv = [sys.executable, "-m", "snakemake", "--snakefile", str(code / "pipeline" / "orchestration" / "Snakefile"),
            "--directory", str(workdir or launch["workflow"]["root"]), "--configfile", str(config), *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    return argv, {**env, "PYTHONPATH": os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])])}


def run_command(config: Path, forcerun: list[str] = ()) -> tuple[list[str], dict[str, str]]:
    """The launch's run: every stage that must run (--forcerun: those asked to run again on new code, and any
    other given)."""
    launch = runs.read_json(config)
    wf, code = launch["workflow"], Path(launch["code"])
    rerun = [*forcerun, *(name for name, stage in launch["stages"].items() if stage["rerun"])]
    args = ["--forcerun", *dict.fromkeys(rerun)] if rerun else []
    if launch["executor"] == "slurm":
        args += ["--profile", str(code / "infra" / "slurm" / "snakemake"),
                 "--slurm-logdir", str(Path(wf["root"]) / STATE_DIR / SLURM_LOG_DIR),
                 "--slurm-jobname-prefix", job_name_prefix(wf["name"], wf["root"]),
                 "--jobs", str(wf["slurm"]["max_jobs"])]
    else:
        args += ["--cores", str(wf["local_jobs"])]
    return snakemake(config, *args, *wf["snakemake_args"])


def prepare(workflow: Workflow, specs: dict[str, StageSpec], lock: LaunchLock) -> Path:
    """Under the lock: the code snapshot, the launch's config; Snakemake's lock released if a dead holder left it."""
    config = write_launch(workflow, specs, take_snapshot(workflow.state_dir))
    if lock.took_over:
        argv, env = snakemake(config, "--unlock")
        subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return config


def run_local(workflow: Workflow, specs: dict[str, StageSpec]) -> int:
    with LaunchLock(workflow) as lock:
        config = prepare(workflow, specs, lock)
        print(f"workflow {workflow.name}: {len(specs)} stages, outputs in {workflow.root}", flush=True)
        argv, env = run_command(config)
        # Snakemake in this terminal's process group: Ctrl-C reaches it (it stops its running stages and exits), and
        # this process waits for it rather than dying first
        child = subprocess.Popen(argv, env=env, cwd=workflow.root)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            code = child.wait()
        finally:
            signal.signal(signal.SIGINT, previous)
    print(f"status: python pipeline/workflow.py +workflow={workflow.name} workflow.root={workflow.root} "
          "workflow.action=status", flush=True)
    return code


def submit_controller(workflow: Workflow, specs: dict[str, StageSpec]) -> int:
    """The controller as a SLURM job of its own (controller.py): no login shell has to stay open for days."""
    controller = workflow.slurm["controller"]
    lock = LaunchLock(workflow)
    lock.acquire()
    try:
        config = prepare(workflow, specs, lock)
        code = runs.read_json(config)["code"]
        log_dir = workflow.state_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        command = f"exec {shlex.quote(sys.executable)} -m pipeline.orchestration.controller {shlex.quote(str(config))}"
        argv = ["sbatch", "--parsable", f"--job-name={job_name_prefix(workflow.name, workflow.root)}-controller",
                f"--output={log_dir}/controller-%j.log", "--open-mode=append", f"--chdir={code}",
                f"--time={controller['time']}", f"--cpus-per-task={controller['cpus']}", f"--mem={controller['mem']}",
                "--requeue", f"--signal=B:USR1@{controller['requeue_lead_s']}"]
        argv += [f"--{key}={value}" for key in ("partition", "account")
                 if (value := controller.get(key) or workflow.slurm.get(key))]
        result = subprocess.run([*argv, "--wrap", command], capture_output=True, text=True, timeout=120,
                                env={**os.environ, "PYTHONPATH": code})
        if result.returncode != 0:
            raise WorkflowError(f"sbatch refused the controller job: {result.stderr.strip()}")
    except BaseException:
        lock.release()
        raise
    job_id = result.stdout.strip().split(";")[0]
    log = log_dir / f"controller-{job_id}.log"
    lock.update(job_id=job_id, submitted=runs.now(), log=str(log), config=str(config))
    print(f"workflow {workflow.name}: controller job {job_id} submitted; it runs the stages as SLURM jobs.\n"
          f"  log:    tail -f {log}\n  status: python pipeline/workflow.py +workflow={workflow.name} "
          f"workflow.root={workflow.root} workflow.action=status\n  stop:   scancel {job_id}   (and its stage jobs)")
    return 0


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


def plan(workflow: Workflow, specs: dict[str, StageSpec]) -> str:
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
        unfinished = [r.parent for r in (workflow.root / name).glob(f"*/{runs.RECORD}")
                      if not r.parent.is_symlink() and (runs.read_json(r) or {}).get("identity") == spec.identity
                      and not (runs.read_json(r) or {}).get("finished")]
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


def html_report(workflow: Workflow, specs: dict[str, StageSpec]) -> Path:
    """Snakemake's HTML report: the stage graph, run times, and the report rule's scores and pictures."""
    out = workflow.root / "report" / "workflow.html"
    with tempfile.TemporaryDirectory(prefix="workflow-report-") as scratch:
        argv, env = snakemake(write_launch(workflow, specs, REPO_ROOT, Path(scratch)), "--report", str(out))
        result = subprocess.run(argv, env=env, cwd=scratch, capture_output=True, text=True)
    if result.returncode != 0:
        raise WorkflowError(f"snakemake --report failed: {result.stderr.strip()[-2000:]}")
    return out
