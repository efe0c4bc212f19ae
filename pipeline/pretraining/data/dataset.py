"""The training stream: an IterableDataset that yields collated batches.

Load it with PretrainingDataLoader (loader.py), or a DataLoader with batch_size=None and the num_workers the
dataset was made for.

What each rank and loader worker reads, and in which order, is pipeline/pretraining/data/epoch_plan.py: disjoint shares,
the same number of batches on every rank (the remainder, fewer than world_size * workers * batch_size rows
at the end of the epoch's shuffled stream, is dropped), a new shuffle every epoch from (seed, epoch).

Resuming: set_epoch(epoch, batches_to_skip=k) makes the next iteration deliver, in the DataLoader's order,
exactly the batches an uninterrupted epoch would have delivered after its first k (worker processes take
rotated roles for that; see epoch_plan.py). Whole shuffle buffers before the resume point are skipped by
counting rows, never read. Exact only with the same world_size,
num_workers, batch_size and shuffle_plan as the interrupted run (and the DataLoader's default in_order=True).

len() is the full epoch's batch count for this rank, also when resuming (Lightning counts the skipped
batches as already done).
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from pipeline.pretraining.data import epoch_plan
from pipeline.pretraining.data.collator import PretrainingCollator
from pipeline.pretraining.data.packed_batch import PackedBatch
from pipeline.pretraining.data.rows import RowGroupReader, Rows, concat
from pipeline.pretraining.data.shard_set import ShardSet
from pipeline.pretraining.data.worker_parts import this_process_part

DEFAULT_BUFFER_ROW_GROUPS = 8   # 8 x 8,192 rows: ~17 MB of int16 tokens at seq 128 per worker
RUN_BATCHES = 64                # dynamic masking masks this many batches' rows per call


class PretrainingDataset(IterableDataset):
    def __init__(self, shard_set: ShardSet, batch_size: int, *, rank: int = 0, world_size: int = 1,
                 num_workers: int = 0, seed: int = 0, epoch: int = 0, batches_to_skip: int = 0,
                 shuffle_buffer_row_groups: int = DEFAULT_BUFFER_ROW_GROUPS, pad_to_multiple_of: int = 8,
                 return_row_index: bool = False, shuffle_plan: int = epoch_plan.SHUFFLE_PLAN, unpad: bool = False,
                 document_layout: bool = False, masked_lm_prob: float | None = None,
                 max_pairs_per_row: int | None = None):
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size or num_workers < 0:
            raise ValueError(f"need batch_size >= 1, 0 <= rank < world_size, num_workers >= 0; got batch_size="
                             f"{batch_size}, rank={rank}, world_size={world_size}, num_workers={num_workers}")
        if shuffle_buffer_row_groups < 1:
            raise ValueError(f"shuffle_buffer_row_groups must be >= 1, got {shuffle_buffer_row_groups}")
        if shuffle_plan not in epoch_plan.SHUFFLE_PLANS:
            raise ValueError(f"unknown shuffle plan {shuffle_plan!r}; this version knows {epoch_plan.SHUFFLE_PLANS}")
        self.shard_set = shard_set
        self.batch_size = batch_size
        self.rank, self.world_size = rank, world_size
        self.num_workers = num_workers          # must equal the DataLoader's: the plan is made for it
        self.seed = seed
        self.shuffle_buffer_row_groups = shuffle_buffer_row_groups
        self.shuffle_plan = shuffle_plan        # how shares are cut into buffers (epoch_plan.py)
        # Yield PackedBatch (one block of bytes per batch: much cheaper to send) instead of a dict. Turned on
        # in the worker processes of a PretrainingDataLoader, which unpacks; a plain DataLoader gets dicts.
        self.pack_batches = False
        # document_layout: batches say which packed document each token is in; masked_lm_prob: dynamic masking at
        # this rate instead of the manifest's; max_pairs_per_row: sentence pairs packed, up to that many a row
        # (collator.py, pair_packing.py)
        self.collator = PretrainingCollator.for_shard_set(shard_set, masked_lm_prob, seed=seed,
                                                          pad_to_multiple_of=pad_to_multiple_of,
                                                          return_row_index=return_row_index, unpad=unpad,
                                                          document_layout=document_layout,
                                                          max_pairs_per_row=max_pairs_per_row)
        self.batches_per_worker = epoch_plan.batches_per_consumer(
            shard_set.total_rows, world_size * self.workers, batch_size)
        if self.batches_per_worker == 0:
            raise ValueError(
                f"shard set {shard_set.path} has {shard_set.total_rows} rows, fewer than one batch per loader worker "
                f"({world_size} ranks x {self.workers} workers x batch {batch_size}); use fewer workers, a smaller "
                "batch or more data")
        self.set_epoch(epoch, batches_to_skip)

    @property
    def workers(self) -> int:
        """Loader workers per rank; num_workers=0 loads in the main process, as one worker."""
        return max(1, self.num_workers)

    def set_epoch(self, epoch: int, batches_to_skip: int = 0) -> None:
        """Call before iter() (i.e. before the DataLoader starts its workers, which copy this object)."""
        if batches_to_skip < 0:
            raise ValueError(f"batches_to_skip must be >= 0, got {batches_to_skip}")
        self.epoch, self.batches_to_skip = epoch, batches_to_skip

    def __len__(self) -> int:
        return self.batches_per_worker * self.workers

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return this_process_part(self._worker_batches, self.num_workers)

    def _worker_batches(self, process: int) -> Iterator[dict[str, torch.Tensor]]:
        epoch, consumed = self.epoch, self.batches_to_skip
        role = epoch_plan.worker_role(process, consumed, self.workers)
        skip_rows = self.batch_size * min(self.batches_per_worker,
                                          epoch_plan.batches_consumed_by_role(role, consumed, self.workers))
        consumer = self.rank * self.workers + role
        groups = self.shard_set.row_groups
        order = epoch_plan.row_group_order(len(groups), self.seed, epoch)
        pieces = epoch_plan.consumer_pieces(groups.rows, order, consumer, self.batches_per_worker * self.batch_size)
        reader = RowGroupReader(self.shard_set)
        pack = self.pack_batches and get_worker_info() is not None
        try:
            for rows in self._batches_of_rows(reader, pieces, consumer, epoch, skip_rows):
                yield PackedBatch.pack(self.collator.arrays(rows, epoch)) if pack else self.collator(rows, epoch)
        finally:
            reader.close()

    def _batches_of_rows(self, reader: RowGroupReader, pieces: list[epoch_plan.Piece], consumer: int, epoch: int,
                         skip_rows: int) -> Iterator[Rows]:
        """Consecutive batch_size rows of the consumer's shuffled stream, from row `skip_rows` on."""
        return _rebatch(self._runs(reader, pieces, consumer, epoch, skip_rows), self.batch_size)

    def _runs(self, reader: RowGroupReader, pieces: list[epoch_plan.Piece], consumer: int, epoch: int,
              skip_rows: int) -> Iterator[Rows]:
        """The consumer's shuffled stream from row `skip_rows` on, in masked runs of up to RUN_BATCHES batches."""
        run_rows = RUN_BATCHES * self.batch_size
        for index, buffer in enumerate(epoch_plan.buffers(pieces, self.shuffle_buffer_row_groups, self.shuffle_plan)):
            buffer_rows = sum(piece.rows for piece in buffer)
            if skip_rows >= buffer_rows:    # consumed before the resume point: not even read
                skip_rows -= buffer_rows
                continue
            rows = reader.read(buffer)
            order = epoch_plan.buffer_permutation(buffer_rows, self.seed, epoch, consumer, index)[skip_rows:]
            skip_rows = 0
            for begin in range(0, len(order), run_rows):
                run = rows.take(order[begin:begin + run_rows])
                # Dynamic sets: masked here, a run at a time (see collator.py), not all at once when a buffer is
                # read, which would stall the worker for ~0.3 s every 8 row groups.
                yield run if run.is_masked else self.collator.mask_rows(run, epoch)


def _rebatch(runs: Iterator[Rows], size: int) -> Iterator[Rows]:
    """Batches of exactly `size` rows from runs of any length, in order."""
    carried: Rows | None = None     # the last rows of a run, completed by the next run's first rows
    for run in runs:
        begin = 0
        if carried is not None:
            begin = min(size - len(carried), len(run))
            carried = concat([carried, run.take(np.arange(begin)).compact()])
            if len(carried) < size:
                continue
            yield carried
            carried = None
        while begin + size <= len(run):
            yield run.take(np.arange(begin, begin + size))
            begin += size
        if begin < len(run):
            carried = run.take(np.arange(begin, len(run))).compact()
    # Shares are whole batches, so nothing is left over.
    assert carried is None, "a worker's share is not a whole number of batches"
