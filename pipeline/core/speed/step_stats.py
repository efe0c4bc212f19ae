"""Step statistics that stay on the device between log steps, and reach the host at log steps only.

On a GPU, reading a device value on the host (`.item()`, `float(t)`, `if t:`) waits for every kernel queued before
it, and so does making a device tensor from a Python number: the host stops queueing work, and the GPU runs dry
behind it. Lightning reads every value logged with prog_bar=True back as a Python number at the end of every batch
(its ResultCollection.metrics, from the logger connector's on_batch_end), also between log steps and with no bar
shown, so a device value logged once is read on every micro-batch after it. The modules therefore log host values
only, made here:

- StatWindow sums a vector of statistics on the device over the micro-batches of a logging window (no read);
- at a log step, `start_copy()` reduces the window over the ranks (one collective, queued on the device like the
  step's kernels) and queues its copy into pinned host memory, and marks the point with a CUDA event;
- at the end of that batch, `HostCopy.wait()` waits for the event only: by then the host has queued the backward and
  the optimizer step behind it, so the device still has the step's work queued while the host waits for the forward's
  statistics (NVIDIA's recipe keeps its step statistics the same way).

On the CPU the same code runs without events or pinned memory.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def ends_log_step(trainer: Any) -> bool:
    """Whether the current micro-batch is the last of an optimizer step after which Lightning writes the loggers
    (its own tests: the accumulation boundary, incl. an epoch's last batch; should_update_logs for the step about to
    complete, global_step counting the steps already done)."""
    if trainer.fit_loop._should_accumulate():
        return False
    every = trainer.log_every_n_steps
    return bool(every) and (trainer.global_step + 1) % every == 0 or bool(trainer.fast_dev_run)


def sum_over_ranks(values: torch.Tensor) -> torch.Tensor:
    """`values` summed over every process of the run, in place, by one all_reduce; as they are on one process.
    Not Lightning's strategy.reduce: it enters torch.distributed.barrier() before its all_reduce (lightning_fabric's
    _sync_ddp), a second collective in the log step's forward, and one the host waits in under NCCL."""
    if torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1:
        torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.SUM)
    return values


class HostCopy:
    """A host copy of a device tensor, queued without blocking; `wait()` returns it once it has arrived."""

    def __init__(self, values: torch.Tensor):
        values = values.detach()
        on_gpu = values.device.type == "cuda"
        # torch.empty without a device: host memory, pinned so that the copy is asynchronous.
        self._host = torch.empty(values.shape, dtype=values.dtype, pin_memory=on_gpu)
        self._host.copy_(values, non_blocking=on_gpu)
        self._arrived = None
        if on_gpu:
            self._arrived = torch.cuda.Event()
            self._arrived.record(torch.cuda.current_stream(values.device))

    def wait(self) -> torch.Tensor:
        if self._arrived is not None:
            self._arrived.synchronize()   # the copy and what was queued before it; not what came after
            self._arrived = None
        return self._host


class StatWindow:
    """Sums of a fixed vector of step statistics over a logging window, on the device."""

    def __init__(self):
        self._sums: torch.Tensor | None = None

    def add(self, values: torch.Tensor) -> None:
        values = values.detach()
        self._sums = values if self._sums is None else self._sums + values

    @property
    def empty(self) -> bool:
        return self._sums is None

    def start_copy(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> HostCopy:
        """Close the window: its sums (reduced by `reduce`, e.g. a sum over the ranks) on their way to the host."""
        if self._sums is None:
            raise RuntimeError("start_copy() on an empty window (nothing was added since the last copy)")
        sums, self._sums = self._sums, None
        return HostCopy(reduce(sums) if reduce is not None else sums)
