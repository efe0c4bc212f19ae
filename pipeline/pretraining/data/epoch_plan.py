"""Which rows each loader worker of each rank reads in an epoch, in which order: pure arithmetic on row counts.

Every process computes the same plan from (seed, epoch) and the row group sizes, so nothing is communicated.

- The epoch's row groups are put in a random order (from seed and epoch), and read as one stream of rows.
- A *consumer* is one loader worker of one rank: consumer = rank * num_workers + worker. Each takes a
  contiguous, equal share of that stream: batches_per_consumer * batch_size rows, where batches_per_consumer =
  total_rows // (consumers * batch_size). Shares are disjoint; the rest of the stream (fewer than
  consumers * batch_size rows, at its end, so different rows each epoch) is dropped. Every rank therefore gets
  exactly num_workers * batches_per_consumer batches, and DDP never waits on a rank that ran out.
- A share is read in *buffers* of a few row groups (pieces of groups where a share starts or ends mid-group);
  each buffer's rows are permuted (seeded by seed, epoch, consumer and buffer), and consecutive batch_size rows
  of the permuted stream form the batches.
- How a share is cut into buffers is the *shuffle plan*, versioned (SHUFFLE_PLANS) because a checkpoint's
  position means "batch k of this plan": every checkpoint records its plan, and a resumed run keeps it.
    1  buffers of groups_per_buffer pieces, then what is left: a share of 8k + 1 pieces ended in a buffer of
       ONE row group, i.e. one shard's rows, for its last ~8,192 rows (the loss jumped there).
    2  the same number of buffers, of near-equal sizes (they differ by at most one piece): never such a tail.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from data_prep.seeding import stable_seed


@dataclasses.dataclass(frozen=True)
class Piece:
    """Rows [start, stop) of row group `group` (an index into ShardSet.row_groups)."""

    group: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def batches_per_consumer(total_rows: int, num_consumers: int, batch_size: int) -> int:
    return total_rows // (num_consumers * batch_size)


def row_group_order(num_groups: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng(stable_seed(seed, "row-group-order", epoch)).permutation(num_groups)


def consumer_pieces(group_rows: np.ndarray, order: np.ndarray, consumer: int, share_rows: int) -> list[Piece]:
    """The pieces of row groups that make up rows [consumer * share_rows, (consumer + 1) * share_rows) of the
    stream of the groups in `order`."""
    sizes = np.asarray(group_rows, dtype=np.int64)[order]
    ends = np.cumsum(sizes)
    begin, end = consumer * share_rows, (consumer + 1) * share_rows
    pieces = []
    position = int(np.searchsorted(ends, begin, side="right"))   # the first group that ends after `begin`
    while position < len(order) and ends[position] - sizes[position] < end:
        group_start = int(ends[position] - sizes[position])
        start, stop = max(begin - group_start, 0), min(end - group_start, int(sizes[position]))
        if stop > start:
            pieces.append(Piece(int(order[position]), start, stop))
        position += 1
    return pieces


SHUFFLE_PLANS = (1, 2)
SHUFFLE_PLAN = 2                 # the plan of new runs
LEGACY_SHUFFLE_PLAN = 1          # the plan of checkpoints that record none (written before plans had versions)


def buffers(pieces: list[Piece], groups_per_buffer: int, plan: int = SHUFFLE_PLAN) -> list[list[Piece]]:
    """The share's pieces cut into consecutive buffers of at most groups_per_buffer pieces, as `plan` says."""
    if plan == 1:
        return [pieces[i:i + groups_per_buffer] for i in range(0, len(pieces), groups_per_buffer)]
    if plan == 2:
        count = -(-len(pieces) // groups_per_buffer)     # as many buffers as plan 1: the same memory bound
        base, extra = divmod(len(pieces), max(count, 1))
        bounds = np.cumsum([0] + [base + 1] * extra + [base] * (count - extra))
        return [pieces[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    raise ValueError(f"unknown shuffle plan {plan!r}; this version knows {SHUFFLE_PLANS}")


def buffer_permutation(rows: int, seed: int, epoch: int, consumer: int, buffer_index: int) -> np.ndarray:
    return np.random.default_rng(stable_seed(seed, "row-shuffle", epoch, consumer, buffer_index)).permutation(rows)


# ------------------------------------------------------------------------------------------------------------
# Resuming. A DataLoader with W workers delivers batch k of an epoch from worker k % W (torch's in-order
# round robin), as that worker's batch k // W. After `consumed` batches, the next one to deliver is therefore
# batch `consumed`, which belongs to worker `consumed % W`. A fresh DataLoader always asks worker 0 first, so
# the worker processes of a resumed epoch take rotated roles: process i plays the consumer of worker
# (i + consumed) % W. Each role skips the batches of it already delivered; the roles with one batch fewer left
# come last in the rotation, so the round robin also ends exactly where an uninterrupted epoch would.

def worker_role(process_index: int, consumed: int, num_workers: int) -> int:
    return (process_index + consumed) % num_workers


def batches_consumed_by_role(role: int, consumed: int, num_workers: int) -> int:
    """How many of the first `consumed` batches (in delivery order) came from worker `role`."""
    return (consumed - role + num_workers - 1) // num_workers
