"""Which loader worker's batches a process delivers: the one place where pre-training's two datasets (dataset.py's
planned epoch, step_stream.py's endless stream under batch-size warm-up) meet torch's worker processes.

Each dataset cuts its batches into max(1, num_workers) parts, one a DataLoader worker. In a worker process, this
process delivers its own part. In the calling process (a DataLoader with no workers, a test), it delivers every part
in the order torch's in-order delivery takes from worker processes, so the stream is the same with or without them.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from torch.utils.data import get_worker_info


def this_process_part(worker_part: Callable[[int], Iterator], num_workers: int) -> Iterator:
    """worker_part(w): the batches of worker w of max(1, num_workers) (num_workers=0 loads in the calling process,
    as one worker); num_workers: the count the dataset was planned for (its parts are cut for it: a DataLoader with
    another count would deliver another stream)."""
    workers = max(1, num_workers)
    info = get_worker_info()
    if info is None:
        return _round_robin([worker_part(process) for process in range(workers)])
    if info.num_workers != workers:
        raise ValueError(f"this dataset was planned for num_workers={num_workers}, but the DataLoader has "
                         f"{info.num_workers} workers: pass the same num_workers to both")
    return worker_part(info.id)


def _round_robin(iterators: list[Iterator]) -> Iterator:
    """torch's in-order delivery from worker processes: one item from each live iterator in turn."""
    live = list(iterators)
    while live:
        for iterator in list(live):
            try:
                yield next(iterator)
            except StopIteration:
                live.remove(iterator)
