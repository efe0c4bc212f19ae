"""The SLURM controller: Snakemake with the SLURM executor, itself running as a small SLURM job, so that a
workflow of days depends on no login shell. `workflow.launcher=slurm` submits it (launch.py) and returns.

    python -m pipeline.orchestration.controller <launch spec>      (the job's command)

1. Takes the launch lock and records its job id (guard.py).
2. Waits for this root's stage jobs that are still queued or running: an earlier controller of this root was
   killed, or this one was requeued. Snakemake cannot adopt them, and must not submit their stages again; once they
   end, their sentinels say which finished.
   Snakemake's records of the sentinels those jobs wrote are then stale (absent, or an earlier try's parameters):
   a sentinel of the stage's current identity has its record dropped, so Snakemake takes the stage as done
   (--cleanup-metadata); one of another identity has its stage run again (--forcerun).
3. Runs Snakemake in its own session, with the job's SLURM_* variables removed but SLURM_CONF kept
   (snakemake_cli.snakemake_env).
4. Signals. SIGUSR1 (sbatch --signal=B:USR1@300, before the job's time limit): Snakemake is killed outright, so
   that it does not cancel the stage jobs, and the job requeues itself; the requeued controller goes on from step 2.
   SIGTERM (scancel of the controller): passed to Snakemake, which cancels the stage jobs it runs and exits.
5. When Snakemake ends: the report, also after a failure.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from pipeline.core.app import REPO_ROOT
from pipeline.orchestration import guard, runs
from pipeline.orchestration.launch import finish
from pipeline.orchestration.slurm_jobs import QueueError, wait_for_stage_jobs
from pipeline.orchestration.snakemake_cli import base_args, job_name_prefix, run_args, snakemake_env
from pipeline.orchestration.spec import WorkflowError, workflow_from_dict


def say(message: str) -> None:
    print(f"[{runs.now()}] {message}", flush=True)


def adopt_sentinels(workflow, spec_path: Path, launch: dict, env: dict[str, str]) -> list[str]:
    """Makes Snakemake's records agree with the sentinels, some of which stage jobs wrote while no Snakemake
    watched (their controller killed or requeued). Without this, a finished stage whose record holds an earlier,
    failed try's parameters runs again, and one finished under another config stands as done. Returns the stages
    to run again."""
    current, rerun = [], []
    for name, stage in launch["stages"].items():
        sentinel = runs.read_json(runs.sentinel_path(workflow.root, name))
        if sentinel is None or stage["entry"] == "report":
            continue
        (current if sentinel.get("identity") == stage["identity"] else rerun).append(name)
    for name in current:
        # One file a call: Snakemake refuses the whole call when one file has no record (nothing to drop there).
        done = subprocess.run([*base_args(workflow, spec_path), "--cleanup-metadata",
                               str(runs.sentinel_path(workflow.root, name)), "--cores", "1", "--quiet"],
                              env=env, cwd=REPO_ROOT, capture_output=True, text=True)
        if done.returncode != 0 and "metadata was not present" not in done.stdout + done.stderr:
            raise WorkflowError(f"snakemake --cleanup-metadata failed for stage {name}:\n{done.stderr[-2000:]}")
    if rerun:
        say(f"finished under another config, run again: {', '.join(rerun)}")
    return rerun


def run_controller(spec_path: Path) -> int:
    launch = runs.read_json(spec_path)
    workflow = workflow_from_dict(launch["workflow"])
    job_id = os.environ.get("SLURM_JOB_ID")
    lock = guard.LaunchLock(workflow)
    lock.acquire()
    previous = guard.controller_record(workflow) or {}
    record = guard.write_controller_record(
        workflow, kind="slurm", job_id=job_id, host=socket.gethostname(), pid=os.getpid(), started=runs.now(),
        restarts=int(os.environ.get("SLURM_RESTART_COUNT") or 0), spec=str(spec_path),
        submitted=previous.get("submitted"), log=previous.get("log"))
    say(f"controller of workflow {workflow.name} (job {job_id}, restart {record['restarts']}), spec {spec_path}")
    try:
        wait_for_stage_jobs(job_name_prefix(workflow), say)
    except QueueError as error:
        say(f"cannot see the queue ({error}): not submitting anything")
        return 1
    env = snakemake_env()
    guard.release_stale_snakemake_lock(workflow, base_args(workflow, spec_path), env)
    rerun = adopt_sentinels(workflow, spec_path, launch, env)
    child = subprocess.Popen([*run_args(workflow, spec_path, "slurm"), *(["--forcerun", *rerun] if rerun else [])],
                             env=env, cwd=REPO_ROOT, start_new_session=True)
    requeued: list[bool] = []

    def requeue(_signum, _frame):
        # Only kill here: the main thread is inside child.wait(), holding Popen's wait lock, so waiting in the
        # handler would deadlock. The requeue itself follows once that wait returns.
        say("time limit near: stopping Snakemake without cancelling its jobs, and requeueing the controller")
        requeued.append(True)
        os.killpg(child.pid, signal.SIGKILL)

    def stop(signum, _frame):
        say(f"{signal.Signals(signum).name}: Snakemake cancels the running stage jobs and stops")
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGUSR1, requeue)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = child.wait()
    if requeued:
        lock.release()
        subprocess.run(["scontrol", "requeue", str(job_id)], check=False)
        return 0
    finish(workflow, spec_path, code, record)
    lock.release()
    say(f"Snakemake exited with status {code}")
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        return run_controller(Path(argv[0]))
    except WorkflowError as error:
        say(f"controller refused: {error}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
