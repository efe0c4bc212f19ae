"""The training stream: disjoint shares per rank and worker, per-epoch shuffles, exact resume, worker transfer."""
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from pipeline.pretraining.data import epoch_plan
from pipeline.pretraining.data.dataset import PretrainingDataset
from pipeline.pretraining.data.loader import PretrainingDataLoader
from pipeline.pretraining.data.rows import RowGroupReader

BATCH = 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def dataset(shard_set, **kwargs):
    kwargs.setdefault("return_row_index", True)
    kwargs.setdefault("shuffle_buffer_row_groups", 2)
    return PretrainingDataset(shard_set, BATCH, **kwargs)


def rows_of(batches):
    return [batch["row_index"].tolist() for batch in batches]


def assert_same_batches(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- the plan ------------------------------------------------------------------------------------------------

def test_consumer_shares_tile_the_shuffled_stream_and_resume_arithmetic_adds_up():
    sizes = np.random.default_rng(0).integers(1, 50, size=40)
    order = epoch_plan.row_group_order(len(sizes), seed=1, epoch=2)
    stream = np.concatenate([np.arange(sizes[g]) + sizes[:g].sum() for g in order])
    consumers, share = 6, epoch_plan.batches_per_consumer(sizes.sum(), 6, 7) * 7
    covered = [row for c in range(consumers) for p in epoch_plan.consumer_pieces(sizes, order, c, share)
               for row in range(sizes[:p.group].sum() + p.start, sizes[:p.group].sum() + p.stop)]
    assert covered == stream[:consumers * share].tolist()
    assert sizes.sum() - consumers * share < consumers * 7
    for workers in (1, 2, 3):
        for consumed in range(12):
            assert sum(epoch_plan.batches_consumed_by_role(r, consumed, workers) for r in range(workers)) == consumed
            # process 0 of a resumed loader delivers first: it must play the worker that owns batch `consumed`
            assert epoch_plan.worker_role(0, consumed, workers) == consumed % workers


# -- shares, shuffles ------------------------------------------------------------------------------------------

def test_two_ranks_of_two_workers_read_every_row_at_most_once_and_equally_many(regrouped_set):
    seen, lengths = [], []
    for rank in range(2):
        data = dataset(regrouped_set, rank=rank, world_size=2, num_workers=2)
        batches = list(PretrainingDataLoader(data))
        assert len(batches) == len(data)            # every rank the same number of batches: DDP never waits
        lengths.append(len(batches))
        seen += [row for rows in rows_of(batches) for row in rows]
        if rank == 1:
            # The in-process iteration plays the workers in the DataLoader's order; a plain DataLoader gives the
            # same batches (without the one-tensor transfer).
            assert_same_batches(list(data), batches)
            assert_same_batches(list(DataLoader(data, batch_size=None, num_workers=2)), batches)
    assert lengths[0] == lengths[1] and len(set(seen)) == len(seen) == 2 * lengths[0] * BATCH
    assert 0 <= regrouped_set.total_rows - len(seen) < 2 * 2 * BATCH    # only the remainder is dropped


def test_each_epoch_is_a_deterministic_new_shuffle(regrouped_set):
    def epoch_rows(epoch, seed=0):
        data = dataset(regrouped_set, seed=seed)
        data.set_epoch(epoch)
        return rows_of(data)
    first = epoch_rows(0)
    assert first == epoch_rows(0)
    assert first != epoch_rows(1) and first != epoch_rows(0, seed=1)
    assert sorted(sum(epoch_rows(1), [])) != sorted(sum(first, []))   # the dropped remainder moves too
    # rows are mixed across row groups within a buffer, not read in file order
    assert sum(first, [])[:64] != sorted(sum(first, [])[:64])


# -- resume ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 2])
def test_skipping_k_batches_continues_exactly_where_the_straight_epoch_was(regrouped_set, workers):
    data = dataset(regrouped_set, num_workers=workers)
    data.set_epoch(1)
    straight = list(PretrainingDataLoader(data))
    for k in ([1, 2, 3, 7, 30, len(straight) - 1, len(straight)] if workers == 0 else [1, 2, 5, len(straight) - 1]):
        data.set_epoch(1, batches_to_skip=k)
        assert_same_batches(list(PretrainingDataLoader(data)), straight[k:])


def test_resuming_does_not_read_the_row_groups_already_consumed(regrouped_set, monkeypatch):
    reads = []
    original = RowGroupReader.read_piece
    monkeypatch.setattr(RowGroupReader, "read_piece", lambda self, piece: reads.append(piece) or original(self, piece))
    data = dataset(regrouped_set)
    list(data)
    whole_epoch = len(reads)
    reads.clear()
    data.set_epoch(0, batches_to_skip=len(data) - 1)
    assert len(list(data)) == 1
    assert whole_epoch > 20 and len(reads) <= 2 + 1    # the last buffer (2 groups), + the one a batch may straddle


# -- misuse ----------------------------------------------------------------------------------------------------

def test_a_dataset_planned_for_other_workers_or_too_small_a_set_is_refused(regrouped_set):
    with pytest.raises(ValueError, match="planned for num_workers=2"):
        list(DataLoader(dataset(regrouped_set, num_workers=2), batch_size=None, num_workers=1))
    with pytest.raises(ValueError, match="fewer than one batch per loader worker"):
        PretrainingDataset(regrouped_set, 1024, world_size=2)
