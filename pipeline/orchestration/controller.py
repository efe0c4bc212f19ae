"""The SLURM controller: Snakemake with the SLURM executor as a small SLURM job of its own (launch.py submits it).

    python -m pipeline.orchestration.controller <launch config>      (the job's command)

On SIGUSR1 (its time limit near) it kills Snakemake, cancelling no stage job, and requeues itself; started again, it
waits for this root's stage jobs in the queue, then adopts what they finished (`snakemake --touch`)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.orchestration import runs
from pipeline.orchestration.launch import job_name_prefix, run_command, snakemake
from pipeline.orchestration.lock import LaunchLock
from pipeline.orchestration.slurm import QueueError, active_stage_jobs, run
from pipeline.orchestration.stage_runner import StageError, read_inputs
from pipeline.orchestration.workflow_config import Stage, WorkflowError, workflow_from_dict

POLL_S = 30.0


def say(message: str) -> None:
    print(f"[{runs.now()}] {message}", flush=True)


def adopt(config: Path) -> list[str]:
    """Snakemake's records made to agree with the sentinels that stage jobs wrote while none watched: a stage whose
    sentinel names its finished run of the version it would run now is marked done; returns the others to run again."""
    launch = runs.read_json(config)
    root, done, again = Path(launch["workflow"]["root"]), [], []
    for name, raw in launch["stages"].items():
        spec = Stage.from_dict(raw)
        if spec.entry == "report" or not runs.sentinel_path(root, name).exists():
            continue
        try:
            contents = {role: i["content"] for role, i in read_inputs(root, spec).items()}
        except StageError:
            again.append(name)
            continue
        finished = runs.finished_run(root, name)
        (done if finished and finished[0].name == runs.version_name(spec.identity, contents, spec.rerun)
         else again).append(name)
    if done:
        argv, env = snakemake(config, "--touch", "--cores", "1", "--forcerun", *done, "--allowed-rules", *done,
                              "--", *(str(runs.sentinel_path(root, n)) for n in done))
        subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    say(f"done: {', '.join(done) or 'none'}; to run again: {', '.join(again) or 'none'}")
    return again


class Controller:
    def __init__(self, config: Path):
        self.config, self.launch = config, runs.read_json(config)
        self.workflow = workflow_from_dict(self.launch["workflow"])
        self.job_id = os.environ.get("SLURM_JOB_ID")
        self.child: subprocess.Popen | None = None
        self.signalled: int | None = None

    def on_signal(self, signum, _frame) -> None:
        # Only note it, and stop Snakemake: the main thread may be inside child.wait(), which holds Popen's lock
        if self.signalled == signal.SIGUSR1:
            return                                  # requeueing: SLURM's own SIGTERM of the requeue changes nothing
        self.signalled = signum
        say(f"{signal.Signals(signum).name}: " + ("time limit near: stopping Snakemake without cancelling its "
            "jobs, and requeueing the controller" if signum == signal.SIGUSR1 else "stopping the workflow"))
        self.stop_snakemake()

    def stop_snakemake(self) -> None:
        if self.child is not None and self.child.poll() is None and self.signalled is not None:
            if self.signalled == signal.SIGUSR1:
                os.killpg(self.child.pid, signal.SIGKILL)
            else:
                self.child.send_signal(signal.SIGTERM)

    def wait_for_stage_jobs(self) -> None:
        told: set[str] = set()
        while self.signalled is None and (jobs := active_stage_jobs(self.prefix)):
            for job in (j for j in jobs if j["job_id"] not in told):
                say(f"waiting for job {job['job_id']} (stage {job['rule']}, {job['state']}), submitted by an earlier "
                    "controller of this workflow")
                told.add(job["job_id"])
            deadline = time.monotonic() + POLL_S
            while self.signalled is None and time.monotonic() < deadline:
                time.sleep(0.5)

    def run(self) -> int:
        for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.on_signal)
        wf = self.launch["workflow"]
        self.prefix = job_name_prefix(wf["name"], wf["root"])
        lock = LaunchLock(self.workflow)
        if str((lock.holder() or {}).get("job_id")) != str(self.job_id):
            lock.acquire(job_id=self.job_id, config=str(self.config), submitted=runs.now())
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        say(f"controller of workflow {wf['name']} (job {self.job_id}, restart {restarts}), config {self.config}")
        try:
            self.wait_for_stage_jobs()
        except QueueError as error:
            say(f"cannot see the queue ({error}): not submitting anything")
            return 1
        if self.signalled is None:
            argv, env = snakemake(self.config, "--unlock")      # we hold the root's lock: any other is stale
            subprocess.run(argv, env=env, capture_output=True, text=True)
            again = adopt(self.config)
            argv, env = run_command(self.config, again)
            self.child = subprocess.Popen(argv, env=env, start_new_session=True)
            self.stop_snakemake()                                # a signal that came just before it started
            code = self.child.wait()
        if self.signalled == signal.SIGUSR1:
            return self.requeue()
        if self.signalled is not None and self.child is None:
            jobs = active_stage_jobs(self.prefix)
            say(f"cancelling this workflow's stage jobs: {', '.join(j['job_id'] for j in jobs) or 'none'}")
            if jobs:
                run(["scancel", *(j["job_id"] for j in jobs)])
            code = 128 + self.signalled
        lock.release()
        say(f"Snakemake exited with status {code}")
        return code

    def requeue(self) -> int:
        result = run(["scontrol", "requeue", str(self.job_id)], check=False)
        if result.returncode != 0:
            say(f"scontrol requeue {self.job_id} failed ({result.stderr.strip()}): the stage jobs go on without a "
                "controller; launch the workflow again to watch them (it waits for them, then goes on)")
            return 1
        return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        return Controller(Path(argv[0])).run()
    except WorkflowError as error:
        say(f"controller refused: {error}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
