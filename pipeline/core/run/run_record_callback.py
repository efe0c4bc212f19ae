"""Writes the run's config record (pipeline/core/run/run_record.py) once training starts: on rank 0, at the step the run
starts from (0, or the checkpoint's on a resume), after the checkpoint was restored without error."""
from __future__ import annotations

import pytorch_lightning as pl

from pipeline.core.run.run_record import StartCheck


class WriteRunRecord(pl.Callback):
    def __init__(self, start: StartCheck):
        self.start = start

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self.start.write(trainer.global_step)
