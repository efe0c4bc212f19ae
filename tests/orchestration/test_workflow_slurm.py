"""The tiny workflow on the real local SLURM (conftest.py's `slurm_cluster`, with accounting), launched as users do:
`workflow.launcher=slurm` returns at once, and the controller, a SLURM job itself, submits the stages. Every job
count below is the accounting's (sacct).

- The scenario of a run of days: launched from another directory (the README's command, its default root relative
  to there); while phase 1 runs, a comment is committed to pipeline/core/devices.py and the stage job is requeued:
  it resumes from its checkpoint in the same run directory, from the code snapshot of its launch, and nothing else
  runs again. Its one process is a job step of its own with the CPUs it asked for. Then the controller is killed
  while that job runs: the relaunch waits for it (requeueing itself on the signal of its time limit meanwhile) and
  submits no stage twice. Finally a code change re-runs a stage when asked (workflow.rerun_code_changed).
- A stage that fails is retried, then stops exactly its dependents; the status says which failed and where its log
  is; a relaunch finishes the rest, its controller requeueing itself on the way without cancelling the stage job.
- The controller's own failures: SIGTERM while it waits for earlier stage jobs cancels them; a launch after the
  controller has left slurmctld (MinJobAge) is not refused; a failed `scontrol requeue` is said. `mem: "0"` asks for
  all of a node's memory.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.workflows import STAGES, Workflow, copy_checkout

WAIT_S = 2400
SLURM_SETTINGS = ("workflow.launcher=slurm", "workflow.slurm.account=bert", "workflow.slurm.controller.mem=1G",
                  "workflow.snakemake_args=['--slurm-init-seconds-before-status-checks=5',"
                  "'--seconds-between-status-checks=10']")
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.org"]


def _controller_id(stdout: str) -> str:
    return re.search(r"controller job (\d+) submitted", stdout).group(1)


def _stage_jobs(cluster, wf: Workflow) -> Counter:
    """Stage -> number of SLURM jobs this workflow root's controllers submitted for it."""
    from pipeline.orchestration.launch import job_name_prefix
    prefix = job_name_prefix("tiny", wf.root.resolve())
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
        time.sleep(2)


def _rank_environment(cluster, job_id: str) -> dict[str, str]:
    """What the job's first step (the stage's processes) was given, read from its process."""
    pids = [line.split()[0] for line in cluster.run("scontrol", "listpids", f"{job_id}.0").stdout.splitlines()[1:]]
    environ = Path(f"/proc/{pids[0]}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(item.split("=", 1) for item in environ if "=" in item)


def _requeued(cluster, job_id: str, restarts: str) -> None:
    """Waits for the job's requeue, then lets it start at once (a job requeued while suspended is also held)."""
    _wait_until(lambda: cluster.job_field(job_id, "Restarts") == restarts
                and cluster.job_field(job_id, "JobState") == "PENDING", 300, f"job {job_id} not requeued", cluster)
    if cluster.job_field(job_id, "Reason") == "JobHeldAdmin":
        cluster.run("scontrol", "release", job_id, check=True)
    cluster.run("scontrol", "update", f"JobId={job_id}", "StartTime=now", check=True)


@pytest.mark.slow
def test_a_commit_and_a_requeue_while_phase_1_runs_resume_it_and_a_killed_controller_re_runs_nothing(
        slurm_cluster, tmp_path):
    repo = copy_checkout(tmp_path / "clone")
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "the launched code"]):
        subprocess.run([*GIT, *command], cwd=repo, check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    wf = Workflow(repo, None, {"SLURM_CONF": str(slurm_cluster.conf)}, cwd=elsewhere)
    phase1 = ("workflow.stages.pretrain_phase1.resources.cpus_per_task=2",
              "workflow.stages.pretrain_phase1.overrides=['trainer.max_steps=60','scheduler.warmup_steps=2',"
              "'data.global_batch_size=8','data.micro_batch_size=8','data.num_workers=0',"
              "'callbacks.checkpoint.every_n_train_steps=10','trainer.enable_progress_bar=false']")
    launched = wf.run(*SLURM_SETTINGS, *phase1)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    controller = _controller_id(launched.stdout)
    refused = wf.run(*SLURM_SETTINGS, *phase1)                    # while the controller runs (data prep)
    assert refused.returncode == 2 and f"already running: SLURM controller job {controller}" in refused.stderr, \
        refused.stdout + refused.stderr

    root = elsewhere / "outputs" / "workflows" / "tiny"
    _wait_until(lambda: list(root.glob("pretrain_phase1/*/checkpoints/step*.ckpt")), WAIT_S, "no checkpoint",
                slurm_cluster)
    stage_job = _running_job(slurm_cluster, "pretrain_phase1")
    slurm_cluster.run("scontrol", "suspend", stage_job, check=True)        # held while the test works
    (run_dir,) = [p.parent for p in root.glob("pretrain_phase1/*/workflow_stage.json") if not p.parent.is_symlink()]
    rank = _rank_environment(slurm_cluster, stage_job)
    assert (rank["SLURM_CPUS_PER_TASK"], rank["OMP_NUM_THREADS"]) == ("2", "2"), rank

    devices = repo / "pipeline" / "core" / "devices.py"
    devices.write_text(devices.read_text() + "\n# a comment committed while phase 1 runs\n")
    subprocess.run([*GIT, "commit", "-qam", "a comment"], cwd=repo, check=True)
    slurm_cluster.run("scontrol", "requeue", stage_job, check=True)
    _requeued(slurm_cluster, stage_job, "1")
    record = run_dir / "workflow_stage.json"
    _wait_until(lambda: len(json.loads(record.read_text())["attempts"]) == 2 and
                _running_job(slurm_cluster, "pretrain_phase1"), WAIT_S, "the requeued job did not start", slurm_cluster)

    # The controller killed outright while the stage job is held: the relaunch (of the new commit) waits for it
    slurm_cluster.run("scontrol", "suspend", stage_job, check=True)
    slurm_cluster.run("scancel", "--full", "--signal=KILL", controller, check=True)
    _wait_until(lambda: slurm_cluster.job_field(controller, "JobState") not in ("RUNNING", "COMPLETING"), 300,
                "the controller did not die", slurm_cluster)
    relaunched = wf.run(*SLURM_SETTINGS, *phase1)
    assert relaunched.returncode == 0, relaunched.stdout + relaunched.stderr
    second = _controller_id(relaunched.stdout)
    log = root / "_workflow" / "logs" / f"controller-{second}.log"
    waiting = f"waiting for job {stage_job} (stage pretrain_phase1, SUSPENDED)"
    _wait_until(lambda: log.exists() and waiting in log.read_text(), WAIT_S, "no wait for the stage job", slurm_cluster)
    # its time limit near while it waits: it requeues itself, and the stage job stays
    slurm_cluster.run("scancel", "--batch", "--signal=USR1", second, check=True)
    _requeued(slurm_cluster, second, "1")
    assert slurm_cluster.job_field(stage_job, "JobState") == "SUSPENDED"
    _wait_until(lambda: "restart 1" in log.read_text() and log.read_text().count(waiting) == 2, WAIT_S,
                "the requeued controller did not wait", slurm_cluster)
    slurm_cluster.run("scontrol", "resume", stage_job, check=True)
    assert slurm_cluster.wait_for_job(second, WAIT_S) == "COMPLETED", slurm_cluster.logs()

    assert _stage_jobs(slurm_cluster, wf) == dict.fromkeys(STAGES, 1)        # no stage submitted twice
    assert (root / "pretrain_phase1" / "current").resolve() == run_dir      # resumed in its own run directory
    attempts = json.loads(record.read_text())["attempts"]
    assert len(attempts) == 2 and attempts[1]["code"] == attempts[0]["code"], attempts
    assert "a comment" not in (Path(attempts[1]["code"]) / "pipeline" / "core" / "devices.py").read_text()
    assert "resuming from" in (run_dir / "train.log").read_text()
    for stage in STAGES[3:]:
        (other,) = [p for p in (root / stage).glob("*/workflow_stage.json") if not p.parent.is_symlink()]
        assert len(json.loads(other.read_text())["attempts"]) == 1
    status = wf.status("workflow.launcher=slurm", *phase1)
    assert all(status[s].startswith("done") for s in STAGES), status
    plan = wf.plan(*SLURM_SETTINGS, *phase1)
    assert all(plan[s].startswith("skip: done") for s in STAGES) and "code changed" in plan["pretrain_phase1"], plan
    assert "--cpus-per-task=2" in plan["sbatch pretrain_phase1"] and "--signal=USR1@120" in plan[
        "sbatch pretrain_phase1"], plan

    # A fix in fine-tuning's code, re-run on request
    finetune = repo / "pipeline" / "finetuning" / "run.py"
    finetune.write_text(finetune.read_text() + "\n# a fix\n")
    asked = wf.run(*SLURM_SETTINGS, *phase1, "workflow.rerun_code_changed=[finetune_sst2]")
    assert slurm_cluster.wait_for_job(_controller_id(asked.stdout), WAIT_S) == "COMPLETED", slurm_cluster.logs()
    assert _stage_jobs(slurm_cluster, wf) == {**dict.fromkeys(STAGES, 1), "finetune_sst2": 2}
    assert len(list((root / "finetune_sst2").glob("*/metrics.json"))) == 3   # two runs (and `current`)


@pytest.mark.slow
def test_a_failed_stage_stops_its_dependents_and_a_relaunch_finishes_them(slurm_cluster, tmp_path):
    wf = Workflow(copy_checkout(tmp_path / "checkout"), tmp_path / "wf", {"SLURM_CONF": str(slurm_cluster.conf)})
    short = ("~workflow.stages.export", "workflow.downstream.tasks=[]", "workflow.report=false",
             "workflow.stages.pretrain_phase1.resources.tasks_per_node=2")
    # passes every check before the launch, fails when the stage opens its shard set (20 predictions per sequence)
    broken = ("workflow.stages.pretrain_phase1.overrides=['trainer.max_steps=20','scheduler.warmup_steps=2',"
              "'data.global_batch_size=8','data.micro_batch_size=4','data.num_workers=0',"
              "'data.max_predictions_per_seq=19']")
    launched = wf.run(*SLURM_SETTINGS, *short, broken, "workflow.retries=1")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    controller = _controller_id(launched.stdout)
    assert slurm_cluster.wait_for_job(controller, WAIT_S) == "FAILED", slurm_cluster.logs()

    status = wf.status("workflow.launcher=slurm", *short, broken)
    assert status["prep_phase1"].startswith("done") and status["prep_phase2"].startswith("done"), status
    assert status["pretrain_phase1"].startswith("failed"), status
    log = status["pretrain_phase1"].split("log: ")[1].split(",")[0]
    assert "max_predictions_per_seq=20" in open(log).read()
    assert status["pretrain_phase2"].startswith("not run"), status
    assert _stage_jobs(slurm_cluster, wf) == {"prep_phase1": 1, "prep_phase2": 1, "pretrain_phase1": 2}   # a retry

    relaunched = wf.run(*SLURM_SETTINGS, *short)
    assert relaunched.returncode == 0, relaunched.stdout + relaunched.stderr
    controller = _controller_id(relaunched.stdout)
    # near its time limit (sbatch --signal=B:USR1@...) the controller requeues itself and leaves its stage job running
    _wait_until(lambda: _running_job(slurm_cluster, "pretrain_phase1"), WAIT_S, "phase 1 never ran", slurm_cluster)
    stage_job = _running_job(slurm_cluster, "pretrain_phase1")
    slurm_cluster.run("scancel", "--batch", "--signal=USR1", controller, check=True)
    _requeued(slurm_cluster, controller, "1")
    assert slurm_cluster.job_field(stage_job, "JobState") in ("RUNNING", "COMPLETING", "COMPLETED")
    assert slurm_cluster.wait_for_job(controller, WAIT_S) == "COMPLETED", slurm_cluster.logs()
    log = (wf.root / "_workflow" / "logs" / f"controller-{controller}.log").read_text()
    assert "requeueing the controller" in log and "restart 1" in log, log
    status = wf.status("workflow.launcher=slurm", *short)
    assert all(status[s].startswith("done") for s in STAGES[:4]), status
    assert _stage_jobs(slurm_cluster, wf) == {"prep_phase1": 1, "prep_phase2": 1, "pretrain_phase1": 3,
                                              "pretrain_phase2": 1}
    ranks = (wf.root / "pretrain_phase1" / "current" / "stage.log").read_text()
    assert "srun --kill-on-bad-exit=1 --nodes=1 --ntasks-per-node=2 --cpus-per-task=1" in ranks


@pytest.mark.slow
def test_the_controller_stops_its_stage_jobs_while_it_waits_and_a_gone_one_blocks_no_launch(slurm_cluster, tmp_path,
                                                                                        monkeypatch):
    from pipeline.orchestration.controller import Controller
    from pipeline.orchestration.launch import job_name_prefix, write_launch
    from pipeline.orchestration.lock import LaunchLock
    from pipeline.orchestration.slurm import rule_resources, sbatch_line
    from pipeline.orchestration.stage_config import stage_specs
    from pipeline.orchestration.workflow_config import load_workflow

    wf = Workflow(copy_checkout(tmp_path / "checkout"), tmp_path / "wf", {"SLURM_CONF": str(slurm_cluster.conf)})
    # a stage job of this root from an earlier controller (as the executor names it), still running
    earlier = slurm_cluster.run("sbatch", "--parsable", f"--job-name={job_name_prefix('tiny', wf.root)}_earlier",
                                "--comment=rule_pretrain_phase1", "-A", "bert", f"--output={tmp_path / 'earlier.out'}",
                                "--wrap", "sleep 600", check=True)
    stage_job = earlier.stdout.strip()
    launched = wf.run(*SLURM_SETTINGS)
    controller = _controller_id(launched.stdout)
    log = wf.root / "_workflow" / "logs" / f"controller-{controller}.log"
    _wait_until(lambda: log.exists() and f"waiting for job {stage_job}" in log.read_text(), WAIT_S, "no wait",
                slurm_cluster)
    slurm_cluster.run("scancel", controller, check=True)                      # SIGTERM while it waits
    assert slurm_cluster.wait_for_job(stage_job, 120) == "CANCELLED"
    _wait_until(lambda: not LaunchLock(load_workflow(["+workflow=tiny", f"workflow.root={wf.root}"])).holder(), 120,
                "the lock was kept", slurm_cluster)

    # A controller killed outright leaves its lock; once SLURM has forgotten the job, a launch takes the lock over
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    workflow = load_workflow(["+workflow=tiny", f"workflow.root={wf.root}"])
    lock = LaunchLock(workflow)
    lock.acquire(job_id=controller, submitted="earlier")
    _wait_until(lambda: slurm_cluster.run("squeue", "-j", controller).returncode != 0, 300, "job still known",
                slurm_cluster)
    lock.acquire()
    assert lock.took_over and lock.holder()["pid"] == os.getpid()
    lock.release()

    # A requeue that SLURM refuses is said, not ignored
    config = write_launch(workflow, stage_specs(workflow, check_shapes=False), wf.repo)
    monkeypatch.setenv("SLURM_JOB_ID", "999999")
    assert Controller(config).requeue() == 1

    # mem "0": all of a node's memory (the test node's RealMemory), which the executor cannot send as --mem=0
    resources = {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 1, "mem": "0", "runtime": 10}
    assert "--mem 16000" in sbatch_line(rule_resources(resources, "train", {}))
