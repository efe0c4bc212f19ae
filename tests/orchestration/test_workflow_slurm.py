"""The tiny workflow on the real local SLURM (conftest.py's `slurm_cluster`, with accounting), launched as users do:
`workflow.launcher=slurm` returns at once, and the controller, a SLURM job itself, submits the stages. Every job
count below is the accounting's (sacct).

- A stage that fails is retried, then stops exactly its dependents; the others finish; the status says which failed
  and where its log is; a re-launch finishes the rest, its controller requeueing itself on the way (the signal of
  its time limit) without cancelling or resubmitting the stage job that runs meanwhile.
- A second launch while the controller runs is refused. The controller killed outright while a stage job runs (as a
  node failure would): a launch after it waits for that job instead of submitting its stage again, and finishes the
  workflow.
  Phase 1 runs there as 2 ranks under srun (DDP over gloo), with the requeue contract.
"""
from __future__ import annotations

import csv
import time
from collections import Counter

import pytest

from conftest import STAGES, Workflow, copy_checkout

WAIT_S = 2400
FAST_CHECKS = ("workflow.snakemake_args=['--slurm-init-seconds-before-status-checks=5',"
               "'--seconds-between-status-checks=10']")
SLURM_SETTINGS = ("workflow.launcher=slurm", "workflow.slurm.account=bert", "workflow.slurm.controller.mem=1G",
                  FAST_CHECKS)


def _controller_id(stdout: str) -> str:
    return stdout.split("controller job ", 1)[1].split()[0]


def _stage_jobs(cluster, wf: Workflow) -> Counter:
    """Stage -> number of SLURM jobs this workflow root's controllers submitted for it."""
    from pipeline.orchestration.snakemake_cli import job_name_prefix
    from pipeline.orchestration.spec import load_workflow
    prefix = job_name_prefix(load_workflow(["+workflow=tiny", f"workflow.root={wf.root}"]))
    return Counter(job["Comment"].removeprefix("rule_") for job in cluster.accounted_jobs()
                   if job["JobName"].startswith(f"{prefix}_"))


def _running_job(cluster, stage: str) -> str | None:
    out = cluster.run("squeue", "-h", "-o", "%i|%T|%k").stdout.split()
    return next((line.split("|")[0] for line in out if line.endswith(f"|RUNNING|rule_{stage}")), None)


def _wait_until(condition, timeout_s: float, what: str, cluster) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s} s\n{cluster.run('squeue').stdout}\n{cluster.logs()}")
        time.sleep(5)


@pytest.mark.slow
def test_a_failed_stage_stops_its_dependents_and_a_relaunch_finishes_them(slurm_cluster, tmp_path):
    wf = Workflow(copy_checkout(tmp_path / "checkout"), tmp_path / "wf", {"SLURM_CONF": str(slurm_cluster.conf)})
    # passes every check before the launch, fails when the stage opens its shard set (20 predictions per sequence)
    broken = ("workflow.stages.pretrain_phase1.overrides=['trainer.max_steps=20','scheduler.warmup_steps=2',"
              "'data.global_batch_size=8','data.micro_batch_size=8','data.num_workers=0',"
              "'data.max_predictions_per_seq=19']")
    launched = wf.run(*SLURM_SETTINGS, broken, "workflow.retries=1")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    controller = _controller_id(launched.stdout)
    assert slurm_cluster.wait_for_job(controller, WAIT_S) == "FAILED", slurm_cluster.logs()

    status = wf.status("workflow.launcher=slurm", broken)
    assert status["prep_phase1"].startswith("done") and status["prep_phase2"].startswith("done"), status
    assert status["pretrain_phase1"].startswith("failed"), status
    log = status["pretrain_phase1"].split("log: ")[1].split(",")[0]
    assert "max_predictions_per_seq=20" in open(log).read()
    assert all(status[s].startswith("not run") for s in STAGES[3:]), status
    assert _stage_jobs(slurm_cluster, wf) == {"prep_phase1": 1, "prep_phase2": 1, "pretrain_phase1": 2}   # a retry
    rows = {row["stage"]: row["state"] for row in csv.DictReader(open(wf.root / "report" / "stages.csv"))}
    assert rows["pretrain_phase1"] == "failed" and rows["finetune_sst2"] == "not run"   # written after the failure

    relaunched = wf.run(*SLURM_SETTINGS)
    assert relaunched.returncode == 0, relaunched.stdout + relaunched.stderr
    controller = _controller_id(relaunched.stdout)
    # near its time limit (sbatch --signal=B:USR1@...) the controller requeues itself and leaves its stage job running
    _wait_until(lambda: _running_job(slurm_cluster, "pretrain_phase1"), WAIT_S, "phase 1 never ran", slurm_cluster)
    stage_job = _running_job(slurm_cluster, "pretrain_phase1")
    slurm_cluster.run("scancel", "--batch", "--signal=USR1", controller, check=True)
    _wait_until(lambda: slurm_cluster.job_field(controller, "Restarts") == "1"
                and slurm_cluster.job_field(controller, "JobState") == "PENDING", 300, "no requeue", slurm_cluster)
    assert slurm_cluster.job_field(stage_job, "JobState") in ("RUNNING", "COMPLETING", "COMPLETED")
    slurm_cluster.run("scontrol", "update", f"JobId={controller}", "StartTime=now", check=True)
    assert slurm_cluster.wait_for_job(controller, WAIT_S) == "COMPLETED", slurm_cluster.logs()
    log = (wf.root / "_workflow" / "logs" / f"controller-{controller}.log").read_text()
    assert "requeueing the controller" in log and "restart 1" in log, log
    status = wf.status("workflow.launcher=slurm")
    assert all(status[s].startswith("done") for s in STAGES), status
    assert _stage_jobs(slurm_cluster, wf) == {"prep_phase1": 1, "prep_phase2": 1, "pretrain_phase1": 3,
                                              "pretrain_phase2": 1, "export": 1, "finetune_sst2": 1}
    assert [row["task"] for row in csv.DictReader(open(wf.root / "report" / "scores.csv"))] == ["sst2"]


@pytest.mark.slow
def test_a_killed_controller_is_relaunched_without_submitting_a_running_stage_again(slurm_cluster, tmp_path):
    wf = Workflow(copy_checkout(tmp_path / "checkout"), tmp_path / "wf", {"SLURM_CONF": str(slurm_cluster.conf)})
    two_ranks = ("workflow.stages.pretrain_phase1.resources.tasks_per_node=2",
                 "workflow.stages.pretrain_phase1.overrides=['trainer.max_steps=80','scheduler.warmup_steps=2',"
                 "'data.global_batch_size=8','data.micro_batch_size=4','data.num_workers=0',"
                 "'callbacks.checkpoint.every_n_train_steps=40','trainer.enable_progress_bar=false']")
    launched = wf.run(*SLURM_SETTINGS, *two_ranks)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    controller = _controller_id(launched.stdout)
    # while the controller runs (the data prep, at this point)
    refused = wf.run(*SLURM_SETTINGS, *two_ranks)
    assert refused.returncode == 2 and f"already running: SLURM controller job {controller}" in refused.stderr, \
        refused.stdout + refused.stderr

    _wait_until(lambda: _running_job(slurm_cluster, "pretrain_phase1"), WAIT_S, "phase 1 never ran", slurm_cluster)
    stage_job = _running_job(slurm_cluster, "pretrain_phase1")
    # Held (SIGSTOP to its ranks) until the relaunched controller has seen it: a stage that finished between the
    # kill and the relaunch would take the other path (its sentinel adopted), as it did in CI at 160 steps in 41 s.
    slurm_cluster.run("scontrol", "suspend", stage_job, check=True)
    slurm_cluster.run("scancel", "--full", "--signal=KILL", controller, check=True)   # no chance to clean up
    _wait_until(lambda: slurm_cluster.job_field(controller, "JobState") not in ("RUNNING", "COMPLETING"), 300,
                "the controller did not die", slurm_cluster)
    assert slurm_cluster.job_field(stage_job, "JobState") == "SUSPENDED"      # its stage is still there without it
    assert slurm_cluster.job_field(stage_job, "NumTasks") == "2"
    assert slurm_cluster.job_field(stage_job, "Requeue") == "1"

    relaunched = wf.run(*SLURM_SETTINGS, *two_ranks)
    assert relaunched.returncode == 0, relaunched.stdout + relaunched.stderr
    second = _controller_id(relaunched.stdout)
    log = wf.root / "_workflow" / "logs" / f"controller-{second}.log"
    waiting = f"waiting for job {stage_job} (stage pretrain_phase1, SUSPENDED)"
    _wait_until(lambda: log.exists() and waiting in log.read_text(), WAIT_S,
                "the relaunched controller did not wait for the stage job", slurm_cluster)
    slurm_cluster.run("scontrol", "resume", stage_job, check=True)
    assert slurm_cluster.wait_for_job(second, WAIT_S) == "COMPLETED", slurm_cluster.logs()
    assert slurm_cluster.job_field(stage_job, "JobState") == "COMPLETED"
    assert _stage_jobs(slurm_cluster, wf) == dict.fromkeys(STAGES, 1)        # no stage submitted twice
    status = wf.status("workflow.launcher=slurm", *two_ranks)
    assert all(status[s].startswith("done") for s in STAGES), status
    ranks = (wf.root / "pretrain_phase1" / "current" / "stage.log").read_text()
    assert "srun --kill-on-bad-exit=1 --nodes=1 --ntasks-per-node=2" in ranks
