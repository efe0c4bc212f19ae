"""What SLURM knows about the workflow's jobs: the state of one job, and this root's stage jobs (named
<prefix>_<run id> by Snakemake's SLURM executor, the prefix naming the workflow root) that are still queued or
running. Every query fails closed: an error raises QueueError, never reads as an empty queue.
"""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

QUERY_TIMEOUT_S = 120


class QueueError(RuntimeError):
    pass


def _query(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        raise QueueError(f"{argv[0]} is not on the PATH")
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise QueueError(f"{' '.join(argv)} did not answer within {QUERY_TIMEOUT_S} s") from None
    if result.returncode != 0:
        raise QueueError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result.stdout


def job_state(job_id: str) -> str:
    """The job's state (PENDING, RUNNING, COMPLETED, FAILED, ...): from squeue while it is queued, else from the
    accounting (sacct)."""
    out = _query(["squeue", "-h", "-j", job_id, "-o", "%T"]).split()
    if out:
        return out[0]
    lines = _query(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"]).split()
    if not lines:
        raise QueueError(f"job {job_id} is neither in the queue nor in the accounting")
    return lines[0].split()[0]


def active_stage_jobs(prefix: str) -> list[dict[str, str]]:
    """This user's queued or running jobs named <prefix>_...: id, state and the rule (from the job's comment,
    which the executor sets to rule_<rule>...)."""
    out = _query(["squeue", "--me", "-h", "-o", "%i|%j|%T|%k"])
    jobs = []
    for line in out.splitlines():
        parts = line.strip().split("|", 3)
        if len(parts) == 4 and parts[1].startswith(f"{prefix}_"):
            comment = parts[3]
            rule = comment[len("rule_"):].split("_wildcards")[0] if comment.startswith("rule_") else comment
            jobs.append({"job_id": parts[0], "state": parts[2], "rule": rule})
    return jobs


def accounted_stage_jobs(log_dir: Path) -> list[dict[str, str]]:
    """Every stage job of this root that started, oldest first: id, state, rule. The executor writes each job's log
    to <log dir>/rule_<rule>/<job id>.log, which names both; the state comes from the accounting."""
    logs = sorted((int(log.stem), log.parent.name[len("rule_"):]) for log in Path(log_dir).glob("rule_*/*.log")
                  if log.stem.isdigit())
    if not logs:
        return []
    out = _query(["sacct", "-X", "-n", "-P", "-j", ",".join(str(job) for job, _ in logs), "-o", "JobID,State"])
    states = {line.split("|")[0]: line.split("|")[1].split()[0] for line in out.splitlines() if "|" in line}
    return [{"job_id": str(job), "state": states.get(str(job), "UNKNOWN"), "rule": rule} for job, rule in logs]


def wait_for_stage_jobs(prefix: str, say, poll_s: float = 30.0) -> None:
    """Block until no job of this root is queued or running: a controller started again (requeued, or launched
    after one was killed) must not submit a stage whose job from before is still there. A stage job that finishes
    meanwhile leaves its sentinel, and Snakemake then sees the stage done."""
    told: set[str] = set()
    while True:
        jobs = active_stage_jobs(prefix)
        if not jobs:
            return
        for job in jobs:
            if job["job_id"] not in told:
                say(f"waiting for job {job['job_id']} (stage {job['rule']}, {job['state']}), submitted by an earlier "
                    "controller of this workflow")
                told.add(job["job_id"])
        time.sleep(poll_s)
