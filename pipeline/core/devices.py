"""How many processes a run has, and the batch arithmetic that follows from it; decided before the Trainer exists."""
from __future__ import annotations

import os
from typing import Any


def devices_per_node(trainer_cfg: dict[str, Any]) -> int:
    """The number of devices Lightning will use on each node for this trainer config."""
    devices, accelerator = trainer_cfg.get("devices", "auto"), trainer_cfg.get("accelerator", "auto")
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str) and "," in devices:
        return len([d for d in devices.split(",") if d.strip()])
    if devices in ("auto", -1, "-1"):
        import torch

        wants_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
        if not wants_gpu:
            return 1
        count = torch.cuda.device_count()
        if count == 0:
            raise ValueError(f"trainer.accelerator={accelerator} but no GPU is visible; on a CPU use trainer=cpu")
        return count
    return int(devices)


def world_size(trainer_cfg: dict[str, Any]) -> int:
    """Devices per node x nodes."""
    return devices_per_node(trainer_cfg) * int(trainer_cfg.get("num_nodes", 1))


def batch_split(global_batch_size: int, max_micro_batch_size: int, world: int) -> tuple[int, int]:
    """(micro-batch, gradient accumulation) for a global batch over `world` processes.

    The global batch is the recipe's (a hyperparameter of the optimisation); data.micro_batch_size is what fits in a
    device's memory, so it is the most sequences one forward/backward pass takes. Each process takes global / world
    sequences per step, in the largest pass of at most that size that divides them: BERT-base's 256 is 32 x 1 on
    8 GPUs, 8 x 1 on 32 and 4 x 1 on 64; global = micro x accumulation x devices x nodes exactly.
    """
    if global_batch_size < 1 or max_micro_batch_size < 1:
        raise ValueError(f"data.global_batch_size ({global_batch_size}) and data.micro_batch_size "
                         f"({max_micro_batch_size}) must be positive")
    if global_batch_size % world != 0:
        raise ValueError(
            f"data.global_batch_size={global_batch_size} does not divide over devices x nodes = {world} processes: "
            f"every process must take the same number of sequences per step. Choose a global batch that is a "
            f"multiple of {world}, or change trainer.devices / trainer.num_nodes.")
    per_process = global_batch_size // world
    micro = max(size for size in range(1, min(max_micro_batch_size, per_process) + 1) if per_process % size == 0)
    return micro, per_process // micro


def is_first_process() -> bool:
    """Global rank 0 as the launchers say it before the Trainer exists (SLURM, torchrun, Lightning's own)."""
    return all(os.environ.get(name, "0") == "0" for name in ("RANK", "SLURM_PROCID", "NODE_RANK", "LOCAL_RANK"))


def is_first_process_on_node() -> bool:
    """Local rank 0 as the launchers say it before the Trainer exists: the one process of each node that does what
    each node must do once (hash its copy of the shards: node-local copies differ from node to node)."""
    return all(os.environ.get(name, "0") == "0" for name in ("LOCAL_RANK", "SLURM_LOCALID"))
