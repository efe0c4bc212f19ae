"""What SLURM says about a job: its state, from squeue while slurmctld holds it, else from the accounting. Every query
fails closed: an error raises QueueError, never reads as an empty queue or a finished job. Used by the locks that
name a SLURM job as their holder (the workflow's launch lock, a training's run directory)."""
from __future__ import annotations

import shutil
import subprocess

QUERY_TIMEOUT_S = 120
ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED",
                 "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED")


class QueueError(RuntimeError):
    pass


def run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise QueueError(f"{argv[0]} is not on the PATH")
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise QueueError(f"{' '.join(argv)} did not answer within {QUERY_TIMEOUT_S} s") from None
    if check and result.returncode != 0:
        raise QueueError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result


def job_state(job_id: str) -> str:
    """PENDING, RUNNING, COMPLETED, FAILED ...: from squeue while slurmctld holds the job (squeue says "Invalid job
    id" once it has left, MinJobAge after it ended), else from the accounting."""
    queued = run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False)
    if queued.returncode == 0 and queued.stdout.split():
        return queued.stdout.split()[0]
    if queued.returncode != 0 and "Invalid job id" not in queued.stderr:
        raise QueueError(f"squeue -j {job_id} failed: {queued.stderr.strip()}")
    states = run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"]).stdout.split()
    if not states:
        raise QueueError(f"job {job_id} is neither in the queue nor in the accounting")
    return states[-1]
