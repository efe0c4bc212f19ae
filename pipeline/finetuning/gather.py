"""Evaluation and prediction on several ranks: each row's result, from whichever rank computed it, once, in row order.

Under DDP each rank sees a share of a split. Lightning's samplers make the shares so: validation's
DistributedSampler pads the shares to equal length by repeating rows from the start of the split, predict's
UnrepeatedDistributedSamplerWrapper leaves them uneven. Every batch carries its rows' positions (`row`), so
rank 0 gathers (row, result) pairs from all ranks, keeps one result per row and puts them in row order. Metrics and
files are then computed once, on rank 0, from exactly the split's rows, whatever the number of ranks.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rows_on_rank_zero(rows: Sequence[int], results: Sequence[Any], num_rows: int, what: str) -> list[Any] | None:
    """On rank 0: the result of every row 0..num_rows-1 of a split, in row order, from this rank's `rows` and
    `results` (aligned) and every other rank's; None on the other ranks. Every rank must call it (a collective).

    A row seen by two ranks (a sampler's repeat) counts once: the results of one model on one row are the same. A
    row seen by none is an error: a file or a metric without it would be wrong without saying so. `what` names
    the split in that error."""
    if len(rows) != len(results):
        raise ValueError(f"{what}: {len(rows)} rows but {len(results)} results")
    if _world_size() == 1:
        shares = [(list(rows), list(results))]
    else:
        shares = [None] * _world_size() if dist.get_rank() == 0 else None
        dist.gather_object((list(rows), list(results)), shares, dst=0)
        if dist.get_rank() != 0:
            return None
    by_row: dict[int, Any] = {}
    for share_rows, share_results in shares:
        for row, result in zip(share_rows, share_results):
            by_row.setdefault(int(row), result)
    missing = sorted(set(range(num_rows)) - set(by_row))
    unknown = sorted(set(by_row) - set(range(num_rows)))
    if missing or unknown:
        raise RuntimeError(f"{what}: {len(missing)} of {num_rows} rows were not evaluated (first: {missing[:5]}) and "
                           f"{len(unknown)} are not in the split (first: {unknown[:5]}); evaluation and prediction "
                           f"must see every row (trainer.limit_val_batches / limit_predict_batches leave rows out)")
    return [by_row[row] for row in range(num_rows)]
