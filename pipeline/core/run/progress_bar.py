"""A progress bar in optimizer steps out of trainer.max_steps (pre-training is bounded by steps, not epochs).

Lightning's default counts the micro-batches of an epoch, which with gradient accumulation and an unbounded
epoch count ("Epoch 0/-2", "8/4") says little about how far the run is.
"""
from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import TQDMProgressBar


class StepProgressBar(TQDMProgressBar):
    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None)
        bar.n = bar.last_print_n = trainer.global_step   # a resumed run starts where its checkpoint was
        bar.set_description(f"step (epoch {trainer.current_epoch})")
        bar.refresh()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        bar, step = self.train_progress_bar, trainer.global_step
        if bar is None or bar.n == step:
            return   # inside an accumulation cycle
        if step % max(1, self.refresh_rate) == 0 or step == trainer.max_steps:
            bar.n = step
            # The metrics change only when logged; reading them converts the logged tensors to floats, which on a
            # GPU waits for the step's queued work: only at the steps that log.
            if step % max(1, trainer.log_every_n_steps) == 0 or step == trainer.max_steps:
                bar.set_postfix(self.get_metrics(trainer, pl_module))
            bar.refresh()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics
