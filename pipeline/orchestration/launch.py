"""A run (`workflow.action=run`): Snakemake here, or the controller as a SLURM job, from a snapshot of the code with
the launch's config (<root>/_workflow/launches/<time>.json, naming the environment's variables, not their values)."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from pipeline.core.app import REPO_ROOT
from pipeline.core.file_stamp import files_sha256
from pipeline.orchestration import runs
from pipeline.orchestration.lock import LaunchLock
from pipeline.orchestration.report import report_files
from pipeline.orchestration.slurm import QueueError, rule_resources, run
from pipeline.orchestration.workflow_config import REPORT_STAGE, STATE_DIR, Stage, Workflow, WorkflowError

SLURM_LOG_DIR = "slurm_logs"
SOURCES = ("pipeline", "model", "data_prep", "conf", "infra", "pyproject.toml")     # what a snapshot holds


def job_name_prefix(name: str, root: str | Path) -> str:
    """What every SLURM job of this workflow root is named after (the executor appends _<run id>): roots never mix."""
    return f"{name[:30]}-{hashlib.sha256(str(root).encode()).hexdigest()[:8]}"


def take_snapshot(state_dir: Path, repo: Path = REPO_ROOT) -> Path:
    """The code snapshot's root (it is importable: its pipeline/, model/ and data_prep/ are the packages)."""
    files = sorted(p for top in SOURCES for p in ([repo / top] if (repo / top).is_file() else (repo / top).rglob("*"))
                   if p.is_file() and "__pycache__" not in p.parts
                   and not any(part.startswith(".") for part in p.relative_to(repo).parts))
    target = state_dir / "code" / files_sha256(files, repo)[:12]
    if not target.is_dir():
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        for path in files:
            (partial / path.relative_to(repo)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, partial / path.relative_to(repo))
        try:
            os.rename(partial, target)
        except OSError:                      # another launch made the same copy meanwhile
            shutil.rmtree(partial)
    return target


def code_environment(code: Path | str, env: dict[str, str]) -> dict[str, str]:
    """`env` with the code snapshot first on PYTHONPATH: what Snakemake, the controller and the stages import."""
    return {**env, "PYTHONPATH": os.pathsep.join([str(code), *filter(None, [env.get("PYTHONPATH")])])}


def stage_environment(specs: dict[str, Stage]) -> dict[str, str]:
    """The stages' environment variables (workflow.env) with their values: for the processes, never for a file."""
    return {key: value for spec in specs.values() for key, value in spec.env.items()}


def write_launch(workflow: Workflow, specs: dict[str, Stage], code: Path, directory: Path | None = None) -> Path:
    """The launch's Snakemake config file: the environment's names, not its values (a key is a secret)."""
    record = {"workflow": {**workflow.config, "env": {}}, "environment": sorted(stage_environment(specs)),
              "code": str(code), "executor": workflow.launcher, "created": runs.now(),
              "stages": {name: {**dataclasses.asdict(spec), "env": {}} for name, spec in specs.items()},
              "rule_resources": {name: rule_resources(spec.resources, spec.entry, workflow.slurm)
                                 for name, spec in specs.items() if spec.entry != REPORT_STAGE},
              "report": report_files(workflow.root, specs) if REPORT_STAGE in specs else []}
    stamp = record["created"][:19].replace(":", "").replace("-", "")
    path = (directory or workflow.state_dir / "launches") / f"{stamp}-{os.getpid()}.json"
    runs.write_json(path, record)
    return path


def snakemake(config: Path, *args: str, workdir: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """Snakemake on the launch's config, from its code snapshot, in this process's environment without the variables
    of the SLURM job it may run in (the controller's geometry must not reach the stage jobs) but SLURM_CONF."""
    launch = runs.read_json(config)
    code = Path(launch["code"])
    argv = [sys.executable, "-m", "snakemake", "--snakefile", str(code / "pipeline" / "orchestration" / "Snakefile"),
            "--directory", str(workdir or launch["workflow"]["root"]), "--configfile", str(config), *args]
    return argv, code_environment(code, {k: v for k, v in os.environ.items()
                                          if not k.startswith("SLURM_") or k == "SLURM_CONF"})


def run_command(config: Path, forcerun: list[str] = ()) -> tuple[list[str], dict[str, str]]:
    """The launch's run; --forcerun: the stages asked to run again on new code, and `forcerun`."""
    launch = runs.read_json(config)
    wf, code = launch["workflow"], Path(launch["code"])
    rerun = [*forcerun, *(name for name, stage in launch["stages"].items() if stage["rerun"])]
    args = ["--forcerun", *dict.fromkeys(rerun)] if rerun else []
    if launch["executor"] == "slurm":
        args += ["--profile", str(code / "pipeline" / "orchestration" / "profiles" / "slurm"),
                 "--slurm-logdir", str(Path(wf["root"]) / STATE_DIR / SLURM_LOG_DIR),
                 "--slurm-jobname-prefix", job_name_prefix(wf["name"], wf["root"]),
                 "--jobs", str(wf["slurm"]["max_jobs"])]
    else:
        args += ["--cores", str(wf["local_jobs"])]
    return snakemake(config, *args, *wf["snakemake_args"])


def prepare(workflow: Workflow, specs: dict[str, Stage], lock: LaunchLock) -> Path:
    """Under the lock: the code snapshot, the launch's config; Snakemake's lock released if a dead holder left it."""
    config = write_launch(workflow, specs, take_snapshot(workflow.state_dir))
    if lock.took_over:
        argv, env = snakemake(config, "--unlock")
        subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return config


def run_local(workflow: Workflow, specs: dict[str, Stage]) -> int:
    with LaunchLock(workflow) as lock:
        config = prepare(workflow, specs, lock)
        print(f"workflow {workflow.name}: {len(specs)} stages, outputs in {workflow.root}", flush=True)
        argv, env = run_command(config)
        env.update(stage_environment(specs))
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


def submit_controller(workflow: Workflow, specs: dict[str, Stage]) -> int:
    """The controller as a SLURM job of its own (controller.py): no login shell has to stay open for days. Submitted
    held, and let go once the lock names it: started any earlier, it would find this process holding the lock."""
    controller = workflow.slurm["controller"]
    lock = LaunchLock(workflow)
    lock.acquire()
    job_id = None
    try:
        config = prepare(workflow, specs, lock)
        code = runs.read_json(config)["code"]
        log_dir = workflow.state_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        command = f"exec {shlex.quote(sys.executable)} -m pipeline.orchestration.controller {shlex.quote(str(config))}"
        argv = ["sbatch", "--parsable", "--hold", "--export=ALL",
                f"--job-name={job_name_prefix(workflow.name, workflow.root)}-controller",
                f"--output={log_dir}/controller-%j.log", "--open-mode=append", f"--chdir={code}",
                f"--time={controller['time']}", f"--cpus-per-task={controller['cpus']}", f"--mem={controller['mem']}",
                "--requeue", f"--signal=B:USR1@{controller['requeue_lead_s']}"]
        argv += [f"--{key}={value}" for key in ("partition", "account")
                 if (value := controller.get(key) or workflow.slurm.get(key))]
        result = subprocess.run([*argv, "--wrap", command], capture_output=True, text=True, timeout=120,
                                env=code_environment(code, {**os.environ, **stage_environment(specs)}))
        if result.returncode != 0:
            raise WorkflowError(f"sbatch refused the controller job: {result.stderr.strip()}")
        job_id = result.stdout.strip().split(";")[0]
        log = log_dir / f"controller-{job_id}.log"
        lock.update(job_id=job_id, submitted=runs.now(), log=str(log), config=str(config))
        try:
            run(["scontrol", "release", job_id])
        except QueueError as error:
            raise WorkflowError(f"the controller job {job_id}, submitted held, could not be let go: {error}") from None
    except BaseException:
        if job_id is not None:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=120)
        lock.release()
        raise
    print(f"workflow {workflow.name}: controller job {job_id} submitted; it runs the stages as SLURM jobs.\n"
          f"  log:    tail -f {log}\n  status: python pipeline/workflow.py +workflow={workflow.name} "
          f"workflow.root={workflow.root} workflow.action=status\n  stop:   scancel {job_id}   (and its stage jobs)")
    return 0
