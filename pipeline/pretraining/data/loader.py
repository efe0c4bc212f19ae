"""The DataLoader for PretrainingDataset: whole batches, the epoch set at every iter(), cheap worker transfer.

- The dataset yields collated batches, so batch_size=None.
- Lightning builds a train DataLoader once (unless reload_dataloaders_every_n_epochs is set) and calls iter()
  on it every epoch. It calls set_epoch only on a loader's *sampler*, which an IterableDataset does not use,
  so the epoch would stay at 0. This loader asks `epoch_and_skip()` at every iter(), in the main process,
  before worker processes copy the dataset, which works with or without reloading.
- Worker processes send each batch as one block of bytes (packed_batch.py); iterating gives the usual dict.
- The workers ignore the requeue signal, whatever the start method (pipeline/core/cluster/requeue_safe_loader.py).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from pipeline.core.cluster.requeue_safe_loader import RequeueSafeDataLoader
from pipeline.pretraining.data.dataset import PretrainingDataset
from pipeline.pretraining.data.packed_batch import PackedBatch


class PretrainingDataLoader(RequeueSafeDataLoader):
    def __init__(self, dataset: PretrainingDataset, epoch_and_skip: Callable[[], tuple[int, int]] | None = None, *,
                 pin_memory: bool = False, prefetch_factor: int | None = None,
                 generator: torch.Generator | None = None):
        """Loads with dataset.num_workers worker processes. epoch_and_skip() -> (epoch, batches_to_skip) is
        asked at every iter(); without it, the dataset's own set_epoch() settings are used. generator: where
        each iter() draws its base seed (torch's global RNG when None)."""
        workers = dataset.num_workers
        super().__init__(
            dataset,
            batch_size=None,              # the dataset yields whole collated batches
            num_workers=workers,
            pin_memory=pin_memory,
            persistent_workers=False,     # workers must copy the dataset anew to see the new epoch
            prefetch_factor=prefetch_factor if workers > 0 else None,
            in_order=True,                # the resume arithmetic relies on round-robin delivery
            worker_init_fn=_pack_in_worker,
            generator=generator,
        )
        self.epoch_and_skip = epoch_and_skip

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if self.epoch_and_skip is not None:
            self.dataset.set_epoch(*self.epoch_and_skip())
        return _unpacked(super().__iter__())

    # Lightning checks for these to know a loader can resume mid-epoch (and warns otherwise). The position
    # needs no state of its own: it is asked for at every iter() (from Lightning's restored batch count).
    def state_dict(self) -> dict:
        return {"epoch": self.dataset.epoch, "batches_skipped_at_start": self.dataset.batches_to_skip}

    def load_state_dict(self, state_dict: dict) -> None:
        pass


def _pack_in_worker(worker_id: int) -> None:
    # On the worker's copy of the dataset only: the caller's dataset keeps yielding dicts to other loaders.
    torch.utils.data.get_worker_info().dataset.pack_batches = True


def _unpacked(batches: Iterator) -> Iterator[dict[str, torch.Tensor]]:
    for batch in batches:
        yield batch.unpack() if isinstance(batch, PackedBatch) else batch


def pin_memory_default(device: torch.device | None) -> bool:
    """Pinned host memory only helps copies to a CUDA device."""
    return device.type == "cuda" if device is not None else torch.cuda.is_available()
