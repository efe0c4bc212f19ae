"""DeepSpeed checkpoints that are either complete or not taken for one (reading them: checkpoint_files.py).

Lightning's DeepSpeedStrategy saves every checkpoint under the fixed tag `checkpoint`, so a save rewrites the
previous one's shards in place, and DeepSpeed writes `latest` from rank 0 as soon as rank 0's own files are written,
while other ranks may still be writing theirs. A job killed then (a node failure, the time limit's SIGKILL, a
preemption) leaves a directory that looks complete and is not, or no whole checkpoint at all.

Here every save goes under a new tag beside the previous one (`global_step<N>`), without `latest`. Once every rank
has written and flushed its files and told rank 0 their sizes (one gather, which is also the barrier), rank 0 records
them (`<tag>/complete.json`: each file's size), then switches `latest` to the new tag with one atomic rename, then
removes the previous tag. Each size is the one its writer measured on the file it flushed: rank 0 asking the file
system for the other ranks' files could read stale sizes (NFS clients cache another client's file attributes for
up to a minute), and a checkpoint so recorded would be passed over at the resume as cut short. Until the switch,
`latest` still names the previous complete tag; after it, the new one. DeepSpeed's own loader, `zero_to_fp32`,
Lightning's convert_zero_checkpoint_to_fp32_state_dict and pipeline/core/checkpoints/weights.py all follow `latest`;
Lightning's resume does too, but first checks for a directory named `checkpoint` (its fixed tag), so loading checks
completeness here instead.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist
from pytorch_lightning.strategies import DeepSpeedStrategy
from pytorch_lightning.trainer.states import TrainerFn
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from pipeline.core.checkpoints.atomic_files import write_atomically
from pipeline.core.checkpoints.checkpoint_files import COMPLETION_RECORD, LATEST, checkpoint_problem, stale_tags

# What Lightning's DeepSpeedStrategy.save_checkpoint leaves out of the client state: the engine writes the weights
# and the optimizer state itself, partitioned.
_ENGINE_OWNED_KEYS = ("state_dict", "optimizer_states")


class CompleteCheckpointsDeepSpeedStrategy(DeepSpeedStrategy):
    """Lightning's DeepSpeedStrategy whose checkpoints are written beside the previous one and switched to only when
    every rank's files are on disk, and loaded only when complete (see the module docstring)."""

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"Trainer.save_checkpoint(..., storage_options=...) is not supported by "
                            f"{type(self).__name__}: DeepSpeed writes its own files")
        directory = Path(self.broadcast(str(filepath)))
        tag = self.broadcast(new_tag(directory, checkpoint.get("global_step")) if self.is_global_zero else None)
        client_state = {k: v for k, v in checkpoint.items() if k not in _ENGINE_OWNED_KEYS}
        self.deepspeed_engine.save_checkpoint(str(directory), client_state=client_state, tag=tag, save_latest=False,
                                              exclude_frozen_parameters=self.exclude_frozen_parameters)
        written = flush_files_of_rank(directory / tag, self.global_rank)
        sizes = {}
        for files in _gathered(written):     # every rank's, once all have written theirs
            sizes.update(files)
        if self.is_global_zero:
            publish(directory, tag, checkpoint.get("global_step"), sizes)
        self.barrier("deepspeed_checkpoint_published")

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(checkpoint_path)
        if not path.is_dir() or (self.load_full_weights and self.zero_stage_3):
            return super().load_checkpoint(checkpoint_path, weights_only)   # a consolidated file: Lightning's path
        problem = checkpoint_problem(path)
        if problem is not None:
            raise FileNotFoundError(f"{path} is not a complete DeepSpeed checkpoint: {problem}")
        # Lightning's DeepSpeedStrategy.load_checkpoint from here on, without its check for a `checkpoint/` directory.
        is_fitting = self.lightning_module.trainer.state.fn == TrainerFn.FITTING
        _, client_state = self.deepspeed_engine.load_checkpoint(
            str(path), load_optimizer_states=is_fitting, load_lr_scheduler_states=False,
            load_module_strict=self.lightning_module.strict_loading)
        if client_state is None:
            raise MisconfigurationException(f"DeepSpeed could not load the checkpoint {path}")
        return client_state


def new_tag(directory: Path, global_step: int | None) -> str:
    """global_step<N>, or global_step<N>.<k> when a tag of that step is there already (saved twice at one step, or
    the leftover of a killed save): a save never writes into existing files."""
    base = f"global_step{global_step if global_step is not None else 0}"
    tag, k = base, 0
    while (directory / tag).exists():
        k += 1
        tag = f"{base}.{k}"
    return tag


def flush_files_of_rank(tag_dir: Path, rank: int) -> dict[str, int]:
    """fsync what this rank wrote (DeepSpeed does not), so that the record written after the gather never describes
    data still in a page cache; returns {name in the tag: size} of those files, as this rank wrote them. A rank's
    files are those DeepSpeed names for it (`zero_pp_rank_<rank>_...`: its ZeRO shards); rank 0's, the others too
    (the model states)."""
    written = {}
    for path in sorted(tag_dir.rglob("*")):
        # by name first: no look at another rank's file (it would fill this node's attribute cache with its size now)
        if _writer(path.name) == rank and path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
                written[str(path.relative_to(tag_dir))] = os.fstat(handle.fileno()).st_size
    return written


def _writer(name: str) -> int:
    match = re.search(r"zero_pp_rank_(\d+)_", name)
    return int(match.group(1)) if match else 0


def _gathered(mine: dict[str, int]) -> list[dict[str, int]]:
    if not (dist.is_available() and dist.is_initialized()):
        return [mine]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def publish(directory: Path, tag: str, global_step: int | None, sizes: dict[str, int]) -> None:
    """Rank 0, after every rank's files are written: record them (`sizes`: as each rank wrote them), switch `latest`
    to the tag, drop older tags."""
    tag_dir = directory / tag
    write_atomically(tag_dir / COMPLETION_RECORD,
                     json.dumps({"global_step": global_step, "files": dict(sorted(sizes.items()))}, indent=1))
    write_atomically(directory / LATEST, tag)
    for old in stale_tags(directory):
        shutil.rmtree(old, ignore_errors=True)
