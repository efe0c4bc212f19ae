"""The controller's start on the real local SLURM (conftest.py's `slurm_cluster`): `workflow.launcher=slurm` takes the
launch lock as this process, submits the controller and records its job id there. A controller that starts before
that record finds this process holding the lock and refuses to run its own launch; here the record is made late, and
only once the controller had every chance to start (the race made certain), so the controller must not have been
able to start before it: it is submitted held and let go once the lock names it (pipeline/orchestration/launch.py).

The same launch carries a W&B key in workflow.env: the stage job that the controller submits has it in its
environment, and no file under the workflow's root holds it."""
from __future__ import annotations

import time
from pathlib import Path

from pipeline.orchestration.launch import job_name_prefix, submit_controller
from pipeline.orchestration.lock import LaunchLock
from pipeline.orchestration.slurm import ACTIVE_STATES, active_stage_jobs
from pipeline.orchestration.stage_config import stage_specs
from pipeline.orchestration.workflow_config import load_workflow

SECRET = "wandb-key-5f0c2a9e7b1d"


def _wait_until(condition, timeout_s: float, what: str, cluster) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s} s\n{cluster.run('squeue').stdout}\n{cluster.logs()}")
        time.sleep(0.5)


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_a_controller_that_starts_at_once_runs_its_launch_with_the_environment_no_file_holds(slurm_cluster, tmp_path,
                                                                                           monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    workflow = load_workflow(["+workflow=tiny", f"workflow.root={tmp_path / 'wf'}", "workflow.launcher=slurm",
                              "workflow.slurm.account=bert", "workflow.slurm.controller.mem=1G",
                              f"workflow.env.WANDB_API_KEY={SECRET}",
                              "workflow.snakemake_args=['--slurm-init-seconds-before-status-checks=5']"])
    specs = stage_specs(workflow, check_shapes=False)
    logs = workflow.state_dir / "logs"

    def controller_said(job_id: str, *what: str) -> bool:
        return any(w in _text(logs / f"controller-{job_id}.log") for w in what)

    record = LaunchLock.update

    def late_record(lock, **fields):
        """The job id written once the controller is held, or has started and read the lock."""
        if "job_id" in fields:
            job_id = fields["job_id"]
            _wait_until(lambda: slurm_cluster.job_field(job_id, "Reason") == "JobHeldUser"
                        or controller_said(job_id, "controller of workflow", "controller refused"), 240,
                        "the controller was neither held nor started", slurm_cluster)
        record(lock, **fields)

    monkeypatch.setattr(LaunchLock, "update", late_record)
    assert submit_controller(workflow, specs) == 0
    job_id = LaunchLock(workflow).holder()["job_id"]
    log = logs / f"controller-{job_id}.log"
    _wait_until(lambda: controller_said(job_id, "controller of workflow", "controller refused"), 240,
                "the controller did not start", slurm_cluster)
    assert not controller_said(job_id, "controller refused"), _text(log)

    # Its first stage job (data prep) has the key in its environment, read from its processes
    def stage_job() -> str | None:
        out = slurm_cluster.run("squeue", "-h", "-o", "%i|%T|%k").stdout.split()
        return next((line.split("|")[0] for line in out if line.endswith("|RUNNING|rule_prep_phase1")), None)

    _wait_until(stage_job, 240, "no stage job ran", slurm_cluster)
    listed = slurm_cluster.run("scontrol", "listpids", stage_job()).stdout.splitlines()[1:]
    pid = next(line.split()[0] for line in listed if int(line.split()[0]) > 0)     # its batch shell (-1: slurmstepd)
    assert f"WANDB_API_KEY={SECRET}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")

    # Once that stage has written its records and logs, everything stops; then no file under the root holds the key
    _wait_until(lambda: (workflow.root / "prep_phase1" / "DONE.json").exists(), 240, "data prep did not finish",
                slurm_cluster)
    jobs = [job_id, *(job["job_id"] for job in active_stage_jobs(job_name_prefix(workflow.name, workflow.root)))]
    slurm_cluster.run("scancel", *jobs, check=True)
    _wait_until(lambda: not any(slurm_cluster.job_field(job, "JobState") in ACTIVE_STATES for job in jobs), 240,
                "the jobs did not end", slurm_cluster)
    holding = [p for p in workflow.root.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not holding, holding
