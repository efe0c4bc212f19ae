"""The workflow and SLURM: what it tells SLURM, a stage's resources as the sbatch options of its job, and what it asks:
the state of a job, and this root's stage jobs still queued or running.

A stage's resources (conf/workflow/: nodes, gpus_per_node, tasks_per_node, cpus_per_task, mem, time, partition, qos,
constraint) become the resources of its Snakemake rule, which the SLURM executor turns into sbatch options. Inside
every stage job the stage runner starts the entry point as a job step of its own (`srun` with the stage's geometry;
stage.py), and Snakemake's own processes stay in the batch step: the `mpi` resource tells the executor so. A stage of
several processes asks for its tasks (--nodes, --ntasks-per-node); a one-process stage gets the `mpi` key with an
empty value, which the submission reads as a plain one-task job. So the time-limit signal of a pre-training job
(infra/slurm/train.sbatch's requeue contract: --signal=USR1@N, --requeue, --open-mode=append) reaches the training
processes, one or many, and never Snakemake's.

Stage jobs are named <prefix>_<run id> by Snakemake's SLURM executor, the prefix naming the workflow root. Every query
fails closed: an error raises QueueError, never reads as an empty queue.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Mapping

from pipeline.core.app import REPO_ROOT
from pipeline.orchestration.spec import ranks_per_node

TRAIN_SBATCH = REPO_ROOT / "infra" / "slurm" / "train.sbatch"
REQUEUE_OPTIONS = ("signal", "requeue", "open-mode")
_MEMORY_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
QUERY_TIMEOUT_S = 120
ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED",
                 "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED")


def requeue_contract(sbatch_file: Path = TRAIN_SBATCH) -> dict[str, str]:
    """option -> value ("" for a flag) of train.sbatch's #SBATCH lines that make a pre-training job requeue."""
    found = {m.group(1): m.group(2) or "" for m in re.finditer(r"^#SBATCH\s+--([\w-]+)(?:=(\S+))?",
                                                              sbatch_file.read_text(encoding="utf-8"), re.M)
             if m.group(1) in REQUEUE_OPTIONS}
    missing = [o for o in REQUEUE_OPTIONS if o not in found]
    if missing:
        raise ValueError(f"{sbatch_file} has no #SBATCH --{', --'.join(missing)}: the requeue contract of "
                         "pre-training jobs is read from it")
    return found


def minutes(time: str) -> int:
    """SLURM's time formats (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in whole minutes, rounded up."""
    days, _, clock = str(time).rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    scale = (3600, 60, 1) if days or len(parts) == 3 else (60, 1)
    seconds = int(days or 0) * 86400 + sum(p * s for p, s in zip(parts, scale))
    return max(1, -(-seconds // 60))


def megabytes(mem: str) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)B?", str(mem).strip().upper())
    if not match:
        raise ValueError(f"memory {mem!r}: give a size such as 64G or 500M (0: all of the node's)")
    return int(float(match.group(1)) * _MEMORY_UNITS[match.group(2) or "M"])


def node_memory_mb(partition: str | None) -> int | None:
    """The memory SLURM can give a job on every node of the partition (the smallest node's RealMemory): what
    `--mem=0` grants, which the executor cannot send (it sends no --mem for 0 and refuses --mem among extra
    options). None without sinfo."""
    if shutil.which("sinfo") is None:
        return None
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%m", *([f"--partition={partition}"] if partition else [])],
                             capture_output=True, text=True, timeout=15).stdout
    except subprocess.TimeoutExpired:         # no SLURM configuration here (sinfo retries for a minute)
        return None
    sizes = [int(v.rstrip("+")) for v in out.split() if v.rstrip("+").isdigit()]
    return min(sizes) if sizes else None


def rule_resources(resources: Mapping[str, Any], entry: str, slurm: Mapping[str, Any]) -> dict[str, Any]:
    """Snakemake resources for a stage (they mean nothing to a local run). Options that the executor sets itself
    (--mem, --ntasks, --gpus, --qos, --constraint ...) are resources, never slurm_extra: it refuses them there."""
    nodes, gpus, per_node = int(resources["nodes"]), int(resources["gpus_per_node"]), ranks_per_node(resources)
    out: dict[str, Any] = {"nodes": nodes, "cpus_per_task": int(resources["cpus_per_task"]), "mpi": "",
                           "runtime": minutes(resources["time"])}
    extra: list[str] = []
    partition = resources.get("partition") or slurm.get("partition")
    mem = resources.get("mem")
    if mem is not None:
        out["mem_mb"] = megabytes(mem) or node_memory_mb(partition) or 0
    if nodes * per_node > 1:
        out["mpi"] = "srun"
        if per_node > 1:
            out["tasks_per_node"] = per_node
        else:
            out["tasks"] = nodes
            extra.append("--ntasks-per-node=1")
        extra += [f"--gpus-per-node={gpus}"] if gpus else []
    elif gpus:
        out["gpu"] = gpus
    if entry == "train":
        contract = requeue_contract()
        extra += ["--requeue", f"--open-mode={contract['open-mode']}", f"--signal={contract['signal']}"]
    for key, resource in (("partition", "slurm_partition"), ("account", "slurm_account"), ("qos", "qos"),
                          ("constraint", "constraint")):
        value = resources.get(key) or slurm.get(key)
        if value:
            out[resource] = str(value)
    extra += [f"--reservation={slurm['reservation']}"] if slurm.get("reservation") else []
    extra += [str(a) for a in slurm.get("extra_args") or ()]
    if extra:
        out["slurm_extra"] = " ".join(extra)
    return out


def sbatch_line(resources: Mapping[str, Any]) -> str:
    """The stage's sbatch options as the SLURM executor builds them (its own submit-command builder)."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    class Job:                               # what the builder reads of a job: its resources and threads
        threads = 1

        def __init__(self):
            self.resources = type("Resources", (dict,), {"__getattr__": dict.get})(resources)

    params = {"run_uuid": "NAME", "slurm_logfile": "LOG", "comment_str": "RULE", "workdir": "",
              "account": f"-A {resources['slurm_account']}" if resources.get("slurm_account") else "",
              "partition": f"-p {resources['slurm_partition']}" if resources.get("slurm_partition") else ""}
    line = get_submit_command(Job(), params) + set_gres_string(Job())
    return " ".join(line.replace("sbatch --parsable --job-name NAME --output LOG --export=ALL --comment RULE",
                                 "").split())


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


def active_stage_jobs(prefix: str) -> list[dict[str, str]]:
    """This user's queued or running jobs named <prefix>_...: id, state and the rule (from the job's comment,
    which the executor sets to rule_<rule>...)."""
    jobs = []
    for line in run(["squeue", "--me", "-h", "-o", "%i|%j|%T|%k"]).stdout.splitlines():
        parts = line.strip().split("|", 3)
        if len(parts) == 4 and parts[1].startswith(f"{prefix}_"):
            rule = parts[3][len("rule_"):].split("_wildcards")[0] if parts[3].startswith("rule_") else parts[3]
            jobs.append({"job_id": parts[0], "state": parts[2], "rule": rule})
    return jobs
