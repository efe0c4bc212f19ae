"""Lightning's SIGTERM agreement between ranks, without a GPU synchronisation on every micro-batch.

On every micro-batch of a fit on several processes, Lightning 2.6.6 (loops/training_epoch_loop.py,
`_broadcast_sigterm_tensor`) makes a tensor of rank 0's "received SIGTERM" flag on the training device, broadcasts
it over the training process group and reads it back with `.item()`; its SIGTERM handler (signal_connector.py,
`_sigterm_notifier_fn`) broadcasts once more, on the training group, from inside the handler. On GPUs the per-batch
check is a host-to-device copy, an NCCL broadcast and a device-to-host read per micro-batch: the host waits for all
the work queued before it, every micro-batch (found by tests/helpers/host_sync.py's guard on 2 CPU ranks).

HostSigtermAgreement replaces both on the Trainer it is given to: the handler only records the signal (and, as
Lightning's, stops the processes its launcher started), and at the first micro-batch of each optimizer step the ranks
agree on it with one all-reduce (MAX: any rank signalled) over a gloo group of their own, on the host; then every
rank raises Lightning's SIGTERMException at the same point. A few microseconds of host time per optimizer step, no
wait for the GPU, no collective inside a signal handler; a SIGTERM stops the fit at the next optimizer step.
"""
from __future__ import annotations

import contextlib
import logging
from types import FrameType
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.utilities.exceptions import SIGTERMException

from pipeline.core.cluster.gloo_address import checked_gloo_group

LOOP_CHECK = "_broadcast_sigterm_tensor"     # trainer.fit_loop.epoch_loop's
HANDLER = "_sigterm_notifier_fn"             # trainer._signal_connector's; registered by the fit after setup()
log = logging.getLogger(__name__)


class HostSigtermAgreement(pl.Callback):
    def __init__(self):
        self._trainer: pl.Trainer | None = None
        self._group = None
        self._calls = 0
        self.signalled = False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or not (dist.is_available() and dist.is_initialized()) or trainer.world_size < 2:
            return
        loop, connector = trainer.fit_loop.epoch_loop, trainer._signal_connector
        for owner, name in ((loop, LOOP_CHECK), (connector, HANDLER)):
            if not callable(getattr(owner, name, None)):
                raise RuntimeError(f"Lightning has no {type(owner).__name__}.{name}() to replace: this pipeline "
                                   "pins pytorch-lightning==2.6.6 (pyproject.toml)")
        # Every rank runs setup: the group is created collectively, on the host (gloo), apart from the training group;
        # across nodes, only where they can reach this host's gloo address (else a 30-minute hang at the first step).
        group = checked_gloo_group(trainer.num_nodes)
        self._trainer, self._group, self._calls, self.signalled = trainer, group, 0, False
        setattr(loop, LOOP_CHECK, self.agree)       # instance attributes shadow the methods
        setattr(connector, HANDLER, self.record)

    def record(self, signum: int, frame: FrameType | None) -> None:
        """The SIGTERM handler: no collective here (it would start wherever the signal interrupted the rank)."""
        log.info("rank %d received signal %d: the fit stops at the next optimizer step", self._trainer.global_rank,
                 signum)
        if not self.signalled and self._trainer.strategy.launcher is not None:
            self._trainer.strategy.launcher.kill(signum)   # as Lightning's handler: the processes it started
        self.signalled = True

    def agree(self) -> None:
        """Called by the loop where Lightning's check was, before each micro-batch (the same count on every rank)."""
        calls, self._calls = self._calls, self._calls + 1
        if calls % max(1, self._trainer.accumulate_grad_batches):
            return   # within an optimizer step
        flag = torch.tensor([1 if self.signalled else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        if int(flag[0]) == 1:
            self._trainer._signal_connector.received_sigterm = True
            with contextlib.suppress(Exception):
                dist.barrier(group=self._group)   # as Lightning: every rank here before any exits
            raise SIGTERMException()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for owner, name in ((trainer.fit_loop.epoch_loop, LOOP_CHECK), (trainer._signal_connector, HANDLER)):
            replacement: Any = vars(owner).get(name)
            if replacement is not None and getattr(replacement, "__self__", None) is self:
                delattr(owner, name)
        self._group = None
