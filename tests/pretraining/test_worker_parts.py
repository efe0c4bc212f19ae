"""pipeline/pretraining/data/worker_parts.py: a process delivers the same stream with loader workers as without them,
parts of unequal length included, and both of pre-training's datasets refuse a DataLoader with another worker count
than the one they were planned for."""
from __future__ import annotations

import itertools

import pytest
from torch.utils.data import DataLoader, IterableDataset

from pipeline.pretraining.data.batch_warmup import BatchWarmup
from pipeline.pretraining.data.dataset import PretrainingDataset
from pipeline.pretraining.data.step_stream import StepStreamDataset
from pipeline.pretraining.data.worker_parts import this_process_part

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PARTS = [[0, 2, 4, 6, 8], [1, 3]]   # worker w's items; the parts end at different lengths


class Parts(IterableDataset):
    def __iter__(self):
        return this_process_part(lambda worker: iter(PARTS[worker]), num_workers=len(PARTS))


def test_without_workers_the_stream_is_the_one_torchs_workers_deliver_in_order():
    through_workers = list(DataLoader(Parts(), batch_size=None, num_workers=len(PARTS)))
    assert through_workers == [0, 1, 2, 3, 4, 6, 8]   # torch skips a worker whose part has ended
    assert list(Parts()) == through_workers


def test_both_datasets_refuse_a_loader_with_other_workers_than_planned(regrouped_set):
    planned = PretrainingDataset(regrouped_set, 16, num_workers=2)
    warmup = BatchWarmup(tokens=4 * 16 * 128, start_batch_size=8, increment=8, full_batch_size=16,
                         tokens_per_row=128)
    endless = StepStreamDataset(regrouped_set, warmup, 1, num_workers=2)
    for dataset in (planned, endless):
        with pytest.raises(ValueError, match="planned for num_workers=2, but the DataLoader has 1 workers"):
            list(itertools.islice(DataLoader(dataset, batch_size=None, num_workers=1), 1))
