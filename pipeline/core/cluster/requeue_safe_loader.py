"""A DataLoader whose worker processes ignore the requeue signal (SIGUSR1), whatever the multiprocessing start method.

SLURM sends the requeue signal to every process of the job step (`--signal=USR1@N` without `B:`, `scancel
--signal=USR1 <job>`): the loader workers get it too. Only the rank's main process acts on it
(pipeline/core/cluster/requeue.py); a worker must live on, or the rank's loader fails ("DataLoader worker ... exited
unexpectedly") and the run dies without its checkpoint. A worker forked from the rank inherits the rank's handler,
which ignores the signal in any process but its owner; a worker started by `spawn`, or forked by the `forkserver`
(Python 3.14's default on Linux), begins with the default action instead, which kills it. So:

- every worker sets SIGUSR1 to SIG_IGN first thing (its worker_init_fn, before the one given);
- while the workers start, the rank's main thread holds the signal back (blocked, not lost: the kernel gives it to
  another of the rank's threads, or keeps it pending until the block ends). A new process inherits that block, also
  through exec, so a worker cannot be killed before its worker_init_fn runs; the forkserver and multiprocessing's
  resource tracker, where this start launches them, keep it for good and live through the signal too.

Lightning and W&B run nothing in the workers; nothing there needs the signal.
"""
from __future__ import annotations

import contextlib
import functools
import signal
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader

# The signal that asks a run to save and requeue (pipeline/core/cluster/requeue.py). Defined here, where the workers
# import it, so that they need not import Lightning.
REQUEUE_SIGNAL = signal.SIGUSR1


def ignore_requeue_signal(worker_id: int, then: Callable[[int], None] | None = None) -> None:
    """A worker_init_fn: ignore the requeue signal in this worker (then release the block it started with), then
    `then(worker_id)`."""
    signal.signal(REQUEUE_SIGNAL, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {REQUEUE_SIGNAL})
    if then is not None:
        then(worker_id)


@contextlib.contextmanager
def requeue_signal_held() -> Iterator[None]:
    """Within: the calling thread does not take the requeue signal, and the processes it starts begin with it
    blocked. Afterwards a signal that came meanwhile is delivered, unless another thread took it already."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {REQUEUE_SIGNAL})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class RequeueSafeDataLoader(DataLoader):
    """torch's DataLoader, whose workers ignore the requeue signal from their first instruction on (module
    docstring). Takes DataLoader's arguments; a worker_init_fn given runs after the signal is set aside."""

    def __init__(self, *args: Any, worker_init_fn: Callable[[int], None] | None = None, **kwargs: Any):
        if not (isinstance(worker_init_fn, functools.partial) and worker_init_fn.func is ignore_requeue_signal):
            # (Lightning may build a loader again from this one's attributes: wrapped once only)
            worker_init_fn = functools.partial(ignore_requeue_signal, then=worker_init_fn)
        super().__init__(*args, worker_init_fn=worker_init_fn, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        with requeue_signal_held():     # the workers start here (every epoch, unless persistent)
            return super().__iter__()
