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

--requeue is the executor's (its `slurm-requeue: true`, in infra/slurm/snakemake/config.yaml), for every stage job:
with it, the executor leaves a job whose node failed to SLURM, which requeues it under the same id. Without it, the
executor counts NODE_FAIL as a failure and submits the stage again (workflow.retries) beside the job that SLURM
requeues: two trainers in one run directory. A pre-training stage is refused where the profile and train.sbatch's
contract disagree.

sbatch options from the workflow config (slurm.reservation, slurm.extra_args: one option per item) reach the
executor's submission, a shell command line, quoted (shlex): a value is passed whole, as one argument, or refused
where it cannot be (spec.py).

Stage jobs are named <prefix>_<run id> by Snakemake's SLURM executor, the prefix naming the workflow root. Queries
fail closed (pipeline/core/slurm_jobs.py).
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

import yaml

from pipeline.core.app import REPO_ROOT
from pipeline.core.slurm_jobs import ACTIVE_STATES, QueueError, job_state, run  # noqa: F401  (lock, controller, views)
from pipeline.orchestration.spec import WorkflowError, ranks_per_node

TRAIN_SBATCH = REPO_ROOT / "infra" / "slurm" / "train.sbatch"
EXECUTOR_PROFILE = REPO_ROOT / "infra" / "slurm" / "snakemake" / "config.yaml"
REQUEUE_OPTIONS = ("signal", "requeue", "open-mode")
_MEMORY_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


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
        if not executor_settings().requeue:
            raise WorkflowError(f"{TRAIN_SBATCH} lets pre-training jobs requeue (#SBATCH --requeue), but "
                                f"{EXECUTOR_PROFILE} does not set slurm-requeue: true: Snakemake would take a node "
                                "failure as a failure and start the stage again beside the job that SLURM requeues")
        extra += [f"--open-mode={contract['open-mode']}", f"--signal={contract['signal']}"]
    for key, resource in (("partition", "slurm_partition"), ("account", "slurm_account"), ("qos", "qos"),
                          ("constraint", "constraint")):
        value = resources.get(key) or slurm.get(key)
        if value:
            out[resource] = str(value)
    extra += [f"--reservation={slurm['reservation']}"] if slurm.get("reservation") else []
    extra += [str(a) for a in slurm.get("extra_args") or ()]
    if extra:
        # the executor appends it to a shell command line as it is: each option one quoted word
        out["slurm_extra"] = " ".join(shlex.quote(option) for option in extra)
    return out


def executor_settings(profile: Path | None = None) -> SimpleNamespace:
    """The SLURM executor's settings in its profile that shape a submission (the rest are its own business)."""
    settings = yaml.safe_load((profile or EXECUTOR_PROFILE).read_text(encoding="utf-8")) or {}
    return SimpleNamespace(**{key: settings.get(f"slurm-{key.replace('_', '-')}")
                              for key in ("requeue", "no_requeue", "qos", "reservation")})


_SUBMIT_HEAD = ["sbatch", "--parsable", "--job-name", "NAME", "--output", "LOG", "--export=ALL", "--comment", "RULE"]


def submit_command(resources: Mapping[str, Any]) -> str:
    """The shell command line with which the SLURM executor submits a stage job (its own builder, with the profile's
    settings), but for the job's name, log and comment (NAME, LOG, RULE) and its command."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    class Job:                               # what the builder reads of a job: its resources and threads
        threads = 1

        def __init__(self):
            self.resources = type("Resources", (dict,), {"__getattr__": dict.get})(resources)

    params = {"run_uuid": "NAME", "slurm_logfile": "LOG", "comment_str": "RULE", "workdir": "",
              **{key: f"{flag} {shlex.quote(str(resources[name]))}" if resources.get(name) else ""
                 for key, flag, name in (("account", "-A", "slurm_account"), ("partition", "-p", "slurm_partition"))}}
    return get_submit_command(Job(), params, settings=executor_settings()) + set_gres_string(Job())


def sbatch_line(resources: Mapping[str, Any]) -> str:
    """The stage's sbatch options, as submit_command gives them to sbatch (shell quoting where needed)."""
    words = shlex.split(submit_command(resources))
    assert words[:len(_SUBMIT_HEAD)] == _SUBMIT_HEAD, words
    return shlex.join(words[len(_SUBMIT_HEAD):])


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
