"""The workflow on SLURM: a stage's resources as its rule's resources for the SLURM executor, with the requeue
contract of pre-training jobs (infra/slurm/train.sbatch); this root's stage jobs in the queue."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from pipeline.core.app import REPO_ROOT
from pipeline.core.cluster.slurm_jobs import ACTIVE_STATES, QueueError, job_state, run  # noqa: F401  (lock, controller, status)
from pipeline.orchestration.workflow_config import WorkflowError, ranks_per_node

TRAIN_SBATCH = REPO_ROOT / "infra" / "slurm" / "train.sbatch"
EXECUTOR_PROFILE = Path(__file__).parent / "profiles" / "slurm" / "config.yaml"
REQUEUE_OPTIONS = ("signal", "requeue", "open-mode")
_MEMORY_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def requeue_contract(sbatch_file: Path = TRAIN_SBATCH) -> dict[str, str]:
    """option -> value ("" for a flag) of train.sbatch's #SBATCH lines that make a pre-training job requeue."""
    found = {m.group(1): m.group(2) or "" for m in re.finditer(r"^#SBATCH\s+--([\w-]+)(?:=(\S+))?",
                                                              sbatch_file.read_text(encoding="utf-8"), re.M)
             if m.group(1) in REQUEUE_OPTIONS}
    if missing := [o for o in REQUEUE_OPTIONS if o not in found]:
        raise ValueError(f"{sbatch_file} has no #SBATCH --{', --'.join(missing)}: the requeue contract of "
                         "pre-training jobs is read from it")
    return found


def minutes(time: str) -> int:
    """Minutes (Snakemake's `runtime` unit), or SLURM's time formats (MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in
    whole minutes, rounded up."""
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
    """What `--mem=0` grants on every node of the partition (the smallest RealMemory), which the executor cannot send
    (no --mem for 0, and no --mem in slurm_extra). None without sinfo."""
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
    """The rule's resources for the SLURM executor. The stage's processes are an srun step of their own, so a
    one-process stage is a plain job (`mpi` empty) and Snakemake never gets a pre-training's time-limit signal. What
    the executor sets itself (--mem, --ntasks, --gpus, --qos ...) is a resource: it refuses it in slurm_extra."""
    nodes, gpus, per_node = int(resources["nodes"]), int(resources["gpus_per_node"]), ranks_per_node(resources)
    out: dict[str, Any] = {"nodes": nodes, "cpus_per_task": int(resources["cpus_per_task"]), "mpi": "",
                           "runtime": minutes(resources["runtime"])}
    for key, resource in (("partition", "slurm_partition"), ("account", "slurm_account"), ("qos", "qos"),
                          ("constraint", "constraint")):
        if value := resources.get(resource) or slurm.get(key):
            out[resource] = str(value)
    if resources.get("mem") is not None:
        out["mem_mb"] = megabytes(resources["mem"]) or node_memory_mb(out.get("slurm_partition")) or 0
    extra: list[str] = []
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
    extra += [f"--reservation={slurm['reservation']}"] if slurm.get("reservation") else []
    extra += [str(a) for a in slurm.get("extra_args") or ()]
    if extra:
        # the executor appends it to a shell command line as it is: each option one quoted word
        out["slurm_extra"] = " ".join(shlex.quote(option) for option in extra)
    return out


def executor_settings() -> SimpleNamespace:
    """The SLURM executor's settings in its profile that shape a submission (the rest are its own business)."""
    settings = yaml.safe_load(EXECUTOR_PROFILE.read_text(encoding="utf-8")) or {}
    return SimpleNamespace(**{key: settings.get(f"slurm-{key.replace('_', '-')}")
                              for key in ("requeue", "no_requeue", "qos", "reservation")})


_SUBMIT_HEAD = ["sbatch", "--parsable", "--job-name", "NAME", "--output", "LOG", "--export=ALL", "--comment", "RULE"]


def sbatch_line(resources: Mapping[str, Any]) -> str:
    """The stage's sbatch options as the SLURM executor submits them (its own builder, with the profile's settings),
    but for the job's name, log and comment (NAME, LOG, RULE) and its command; quoted for a shell."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    job = SimpleNamespace(threads=1, resources=type("Resources", (dict,), {"__getattr__": dict.get})(resources))
    params = {"run_uuid": "NAME", "slurm_logfile": "LOG", "comment_str": "RULE", "workdir": "",
              **{key: f"{flag} {shlex.quote(str(resources[name]))}" if resources.get(name) else ""
                 for key, flag, name in (("account", "-A", "slurm_account"), ("partition", "-p", "slurm_partition"))}}
    words = shlex.split(get_submit_command(job, params, settings=executor_settings()) + set_gres_string(job))
    assert words[:len(_SUBMIT_HEAD)] == _SUBMIT_HEAD, words
    return shlex.join(words[len(_SUBMIT_HEAD):])


def active_stage_jobs(prefix: str) -> list[dict[str, str]]:
    """This user's queued or running jobs named <prefix>_...: id, state and rule (the executor's comment rule_...)."""
    jobs = []
    for line in run(["squeue", "--me", "-h", "-o", "%i|%j|%T|%k"]).stdout.splitlines():
        parts = line.strip().split("|", 3)
        if len(parts) == 4 and parts[1].startswith(f"{prefix}_"):
            rule = parts[3][len("rule_"):].split("_wildcards")[0] if parts[3].startswith("rule_") else parts[3]
            jobs.append({"job_id": parts[0], "state": parts[2], "rule": rule})
    return jobs
