"""Moves a rollback's later checkpoints aside (pipeline/core/run/rollback.py) once training starts: on rank 0, after the
checkpoint resumed from was restored without error, and before the first save of the new course could overwrite
them. Every rank has decided by then (each does before it joins the process group), so none sees them half moved."""
from __future__ import annotations

import logging

import pytorch_lightning as pl

from pipeline.core.run.rollback import Rollback

log = logging.getLogger(__name__)


class MoveLaterCheckpointsAside(pl.Callback):
    def __init__(self, rollback: Rollback):
        self.rollback = rollback

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            aside = self.rollback.move_aside()
            log.warning("rolled back to step %d: moved %s to %s", self.rollback.step, self.rollback.listed(), aside)
