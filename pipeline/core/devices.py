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


def gradient_accumulation(global_batch_size: int, micro_batch_size: int, world: int) -> int:
    """global = micro x accumulation x devices x nodes; refuse a global batch that this does not give exactly."""
    if global_batch_size < 1 or micro_batch_size < 1:
        raise ValueError(f"data.global_batch_size ({global_batch_size}) and data.micro_batch_size "
                         f"({micro_batch_size}) must be positive")
    per_pass = micro_batch_size * world
    if global_batch_size % per_pass != 0:
        raise ValueError(
            f"data.global_batch_size={global_batch_size} is not divisible by micro_batch_size x devices x nodes = "
            f"{micro_batch_size} x {world} = {per_pass}: the gradient accumulation "
            f"{global_batch_size}/{per_pass} would not be a whole number. Choose a global batch that is a multiple "
            f"of {per_pass}, or change data.micro_batch_size / trainer.devices / trainer.num_nodes.")
    return global_batch_size // per_pass


def is_first_process() -> bool:
    """Global rank 0 as the launchers say it before the Trainer exists (SLURM, torchrun, Lightning's own)."""
    return all(os.environ.get(name, "0") == "0" for name in ("RANK", "SLURM_PROCID", "NODE_RANK", "LOCAL_RANK"))
