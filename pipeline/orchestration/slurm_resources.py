"""A stage's resources (conf/workflow/: nodes, gpus_per_node, tasks_per_node, cpus_per_task, mem, time) as the
resources of its Snakemake rule, which the SLURM executor turns into sbatch options.

- A stage of several processes is an `mpi` job: sbatch gets --nodes and --ntasks-per-node, and the stage runner
  starts the ranks with `srun` inside it (one per GPU, as infra/slurm/train.sbatch does), while Snakemake's own
  job step stays outside of them. A one-process stage runs inside the executor's `srun -n1` step.
- Pre-training jobs take the requeue contract of infra/slurm/train.sbatch, read from its #SBATCH lines (the one
  place it is written): --requeue and --open-mode=append always, and --signal=USR1@N, on which Lightning
  checkpoints and requeues, where the ranks are their own job step (the signal goes to every process of a step,
  and would stop Snakemake's own step of a one-process job, which does not handle it).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from pipeline.core.app import REPO_ROOT

TRAIN_SBATCH = REPO_ROOT / "infra" / "slurm" / "train.sbatch"
REQUEUE_OPTIONS = ("signal", "requeue", "open-mode")
_MEMORY_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def requeue_contract(sbatch_file: Path = TRAIN_SBATCH) -> dict[str, str]:
    """option -> value ("" for a flag) of train.sbatch's #SBATCH lines that make a pre-training job requeue."""
    found = {}
    for line in sbatch_file.read_text(encoding="utf-8").splitlines():
        match = re.match(r"#SBATCH\s+--([\w-]+)(?:=(\S+))?", line)
        if match and match.group(1) in REQUEUE_OPTIONS:
            found[match.group(1)] = match.group(2) or ""
    missing = [o for o in REQUEUE_OPTIONS if o not in found]
    if missing:
        raise ValueError(f"{sbatch_file} has no #SBATCH --{', --'.join(missing)}: the requeue contract of "
                         "pre-training jobs is read from it")
    return found


def minutes(time: str) -> int:
    """SLURM's time formats (MM, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in whole minutes, rounded up."""
    days, _, clock = str(time).rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:
        seconds = int(days) * 86400 + sum(p * s for p, s in zip(parts, (3600, 60, 1)))
    elif len(parts) == 3:
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    elif len(parts) == 2:
        seconds = parts[0] * 60 + parts[1]
    else:
        seconds = parts[0] * 60
    return max(1, -(-seconds // 60))


def megabytes(mem: str) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)B?", str(mem).strip().upper())
    if not match:
        raise ValueError(f"memory {mem!r}: give a size such as 64G or 500M (0: all of the node's)")
    return int(float(match.group(1)) * _MEMORY_UNITS[match.group(2) or "M"])


def rule_resources(resources: Mapping[str, Any], entry: str, slurm: Mapping[str, Any]) -> dict[str, Any]:
    """Snakemake resources for a stage (they mean nothing to a local run). Options that the executor sets itself
    (--mem, --ntasks, --gpus ...) must not be in slurm_extra: it refuses them."""
    nodes, gpus = int(resources["nodes"]), int(resources["gpus_per_node"])
    per_node = int(resources.get("tasks_per_node") or max(1, gpus))
    out: dict[str, Any] = {"nodes": nodes, "cpus_per_task": int(resources["cpus_per_task"]),
                           "runtime": minutes(resources["time"]), "mem_mb": 0}
    extra: list[str] = []
    mem = resources.get("mem")
    if mem is not None:
        # 0 asks for no amount: the partition's default (the executor owns --mem and sends none for 0)
        out["mem_mb"] = megabytes(mem)
    several = nodes * per_node > 1
    if several:
        out["mpi"] = "srun"
        if per_node > 1:
            out["tasks_per_node"] = per_node
        else:
            out["tasks"] = nodes
            extra.append("--ntasks-per-node=1")
    if gpus and several:
        extra.append(f"--gpus-per-node={gpus}")
    elif gpus:
        out["gpu"] = gpus
    if entry == "train":
        contract = requeue_contract()
        extra += ["--requeue", f"--open-mode={contract['open-mode']}"]
        if several:
            extra.append(f"--signal={contract['signal']}")
    if slurm.get("partition"):
        out["slurm_partition"] = str(slurm["partition"])
    if slurm.get("account"):
        out["slurm_account"] = str(slurm["account"])
    extra += [str(a) for a in slurm.get("extra_args") or ()]
    if extra:
        out["slurm_extra"] = " ".join(extra)
    return out
