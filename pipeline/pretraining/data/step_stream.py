"""The training stream under batch-size warm-up: an endless IterableDataset of collated micro-batches whose rows are
a pure function of the step (batch_warmup.py says which positions; this module reads them).

The stream. Epoch e is the set's row groups in the order epoch_plan draws for (seed, e), read as one stream, cut into
buffers of shuffle_buffer_row_groups groups (epoch_plan's plan 2, over the whole stream rather than one consumer's
share), each buffer's rows permuted from (seed, e, buffer). The epochs follow each other without a row dropped: the
stream has no end, and Lightning sees one endless epoch bounded by trainer.max_steps.

Who reads what. This rank's micro-batch i (i counted from the run's start) is micro-batch i % A of step i // A.
Loader worker w of k yields i = skip + w, skip + w + k, ... so the DataLoader's round robin delivers skip, skip + 1,
... whatever k is: a resume (skip = the micro-batches this rank has consumed, from Lightning's restored count)
continues exactly, with any num_workers. Each worker walks the stream forward, reading a buffer when one of its
micro-batches reaches it and skipping (never reading) those before: the rows a worker needs are spread over every
buffer its steps cross, so each worker of each rank reads every such buffer once (W x k reads of the data, where the
plain plan reads it once; a buffer is shuffle_buffer_row_groups x 8,192 rows, a dozen steps of ModernBERT's 4,608).

Dynamic masking is seeded per row and epoch (collator.py), so a row gets the same masks in any micro-batch.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from data_prep.seeding import stable_seed
from pipeline.pretraining.data import epoch_plan
from pipeline.pretraining.data.batch_warmup import BatchWarmup
from pipeline.pretraining.data.collator import PretrainingCollator
from pipeline.pretraining.data.dataset import DEFAULT_BUFFER_ROW_GROUPS
from pipeline.pretraining.data.packed_batch import PackedBatch
from pipeline.pretraining.data.rows import RowGroupReader, Rows, concat
from pipeline.pretraining.data.shard_set import ShardSet
from pipeline.pretraining.data.worker_parts import this_process_part


class EpochBuffers:
    """Epoch e's shuffle buffers: their stream positions within the epoch and their row-group pieces."""

    def __init__(self, shard_set: ShardSet, seed: int, epoch: int, groups_per_buffer: int):
        groups = shard_set.row_groups
        order = epoch_plan.row_group_order(len(groups), seed, epoch)
        pieces = epoch_plan.consumer_pieces(groups.rows, order, 0, shard_set.total_rows)   # every group, whole
        self.buffers = epoch_plan.buffers(pieces, groups_per_buffer, plan=2)
        self.ends = np.cumsum([sum(piece.rows for piece in buffer) for buffer in self.buffers])

    def index_at(self, position: int) -> int:
        return int(np.searchsorted(self.ends, position, side="right"))

    def bounds(self, index: int) -> tuple[int, int]:
        return int(self.ends[index - 1]) if index else 0, int(self.ends[index])


def buffer_permutation(rows: int, seed: int, epoch: int, buffer_index: int) -> np.ndarray:
    return np.random.default_rng(stable_seed(seed, "step-stream-shuffle", epoch, buffer_index)).permutation(rows)


class StreamReader:
    """Rows of the stream by position, read forward: one buffer in memory at a time."""

    def __init__(self, shard_set: ShardSet, seed: int, groups_per_buffer: int):
        self.shard_set, self.seed, self.groups_per_buffer = shard_set, seed, groups_per_buffer
        self.rows_per_epoch = shard_set.total_rows
        self.reader = RowGroupReader(shard_set)
        self._epoch: tuple[int, EpochBuffers] | None = None
        self._buffer: tuple[int, int, int, int, Rows] | None = None   # (epoch, index, begin, end, shuffled rows)

    def take(self, start: int, stop: int) -> list[tuple[int, Rows]]:
        """Positions [start, stop) as (epoch, rows) parts, in order (two parts where they cross an epoch or buffer)."""
        parts, position = [], start
        while position < stop:
            epoch, offset = divmod(position, self.rows_per_epoch)
            _, _, begin, end, rows = self._buffer_at(epoch, offset)
            last = min(stop - epoch * self.rows_per_epoch, end)
            parts.append((epoch, rows.take(np.arange(offset - begin, last - begin))))
            position = epoch * self.rows_per_epoch + last
        return parts

    def _buffer_at(self, epoch: int, offset: int) -> tuple[int, int, int, int, Rows]:
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, EpochBuffers(self.shard_set, self.seed, epoch, self.groups_per_buffer))
        buffers = self._epoch[1]
        index = buffers.index_at(offset)
        if self._buffer is None or self._buffer[:2] != (epoch, index):
            begin, end = buffers.bounds(index)
            rows = self.reader.read(buffers.buffers[index])
            self._buffer = (epoch, index, begin, end,
                            rows.take(buffer_permutation(end - begin, self.seed, epoch, index)))
        return self._buffer

    def close(self) -> None:
        self.reader.close()


class StepStreamDataset(IterableDataset):
    """This rank's micro-batches under batch warm-up; the interface PretrainingDataLoader and the datamodule use
    (num_workers, set_epoch, epoch, batches_to_skip, pack_batches) as PretrainingDataset's. No len(): endless."""

    def __init__(self, shard_set: ShardSet, warmup: BatchWarmup, accumulation: int, *, rank: int = 0,
                 world_size: int = 1, num_workers: int = 0, seed: int = 0, batches_to_skip: int = 0,
                 shuffle_buffer_row_groups: int = DEFAULT_BUFFER_ROW_GROUPS, pad_to_multiple_of: int = 8,
                 return_row_index: bool = False, unpad: bool = False, document_layout: bool = False,
                 masked_lm_prob: float | None = None, max_pairs_per_row: int | None = None):
        if accumulation < 1 or world_size < 1 or not 0 <= rank < world_size or num_workers < 0:
            raise ValueError(f"need accumulation >= 1, 0 <= rank < world_size, num_workers >= 0; got accumulation="
                             f"{accumulation}, rank={rank}, world_size={world_size}, num_workers={num_workers}")
        warmup.check_divides(world_size * accumulation)
        self.shard_set, self.warmup, self.accumulation = shard_set, warmup, accumulation
        self.rank, self.world_size, self.num_workers, self.seed = rank, world_size, num_workers, seed
        self.shuffle_buffer_row_groups = shuffle_buffer_row_groups
        self.pack_batches = False      # set in a PretrainingDataLoader's worker processes (loader.py)
        self.collator = PretrainingCollator.for_shard_set(shard_set, masked_lm_prob, seed=seed,
                                                          pad_to_multiple_of=pad_to_multiple_of,
                                                          return_row_index=return_row_index, unpad=unpad,
                                                          document_layout=document_layout,
                                                          max_pairs_per_row=max_pairs_per_row)
        self.set_epoch(0, batches_to_skip)

    @property
    def workers(self) -> int:
        return max(1, self.num_workers)

    def set_epoch(self, epoch: int, batches_to_skip: int = 0) -> None:
        """batches_to_skip: the micro-batches this rank has consumed since the run's start. The epoch is Lightning's,
        always 0 here (the stream's epochs are positions in it); kept for the loader's interface."""
        if batches_to_skip < 0:
            raise ValueError(f"batches_to_skip must be >= 0, got {batches_to_skip}")
        self.epoch, self.batches_to_skip = epoch, batches_to_skip

    def micro_batch_span(self, index: int) -> tuple[int, int]:
        """Stream positions of this rank's micro-batch `index` (counted from the run's start)."""
        step, within = divmod(index, self.accumulation)
        return self.warmup.micro_batch_span(step, self.rank, self.world_size, self.accumulation, within)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return this_process_part(self._worker_batches, self.num_workers)

    def _worker_batches(self, process: int) -> Iterator[dict[str, torch.Tensor]]:
        stream = StreamReader(self.shard_set, self.seed, self.shuffle_buffer_row_groups)
        pack = self.pack_batches and get_worker_info() is not None
        index = self.batches_to_skip + process
        try:
            while True:
                parts = stream.take(*self.micro_batch_span(index))
                rows = self._masked(parts)
                arrays = self.collator.arrays(rows, parts[0][0])
                yield PackedBatch.pack(arrays) if pack else {k: torch.from_numpy(v) for k, v in arrays.items()}
                index += self.workers
        finally:
            stream.close()

    def _masked(self, parts: list[tuple[int, Rows]]) -> Rows:
        """The parts' rows as one batch; a dynamic set's masked with each row's own epoch."""
        if not parts[0][1].is_masked:
            return concat([self.collator.mask_rows(rows, epoch) for epoch, rows in parts])
        return parts[0][1] if len(parts) == 1 else concat([rows.compact() for _, rows in parts])
