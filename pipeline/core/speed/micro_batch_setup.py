"""The pass sized to the card at the run's start (micro_batch.py says how `auto` resolves): the Lightning callback,
apart from the plan so that the pre-flight checks, which plan the pass, do not import Lightning. The probe, the
device memory and the peak statistics are looked up in micro_batch.py at call time, where tests replace them."""
from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DeepSpeedStrategy

from pipeline.core.devices import batch_split
from pipeline.core.speed import micro_batch
from pipeline.core.speed.micro_batch import (
    CPU_MICRO_BATCH_SIZE,
    GIB,
    RECORD_NAME,
    Fit,
    MicroBatchPlan,
    NoPassFits,
    agree_on_size,
    largest_that_fits,
    release_memory,
    write_record,
)

log = micro_batch.log


class MicroBatchSetup(pl.Callback):
    """At setup, on every rank: the probe where the plan is provisional, the size agreed over the ranks and handed to
    the loop, the loaders, validation's interval and DeepSpeed's config; then, on rank 0, the log and the record."""

    def __init__(self, plan: MicroBatchPlan):
        self.plan = plan
        self.size, self.accumulation = plan.size, plan.accumulation
        self.fit: Fit | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if self.plan.source == "probe":
            self.size, self.fit = self._probe(trainer, pl_module)
            _, self.accumulation = batch_split(self.plan.global_batch_size, self.size, self.plan.world_size)
            self._apply(trainer)
        if trainer.is_global_zero:
            self._log()
            write_record(self.plan.output_dir, self._record(trainer))

    def _probe(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[int, Fit | None]:
        device, model = trainer.strategy.root_device, pl_module.model
        home = next(model.parameters()).device       # the strategy moves the model itself, later
        probe = micro_batch.PassProbe(model, max_seq_length=self.plan.max_seq_length, precision=self.plan.precision,
                                      max_predictions=trainer.datamodule.shard_set.max_predictions_per_seq,
                                      device=device)
        fit, failure = None, None
        try:
            model.to(device)
            fit = largest_that_fits(self.plan.per_process, probe, micro_batch.device_memory_bytes(device),
                                    self.plan.margin)
        except Exception as error:   # every rank must reach the agreement below, or the others would wait for ever
            failure = error
        finally:
            model.to(home)
            release_memory(device)
            micro_batch.forget_peak_memory(device)
        agreed = agree_on_size(fit.size if fit else 0, device)
        if failure is not None:
            raise failure
        if agreed == 0:
            raise NoPassFits("data.micro_batch_size=auto: another rank found no pass that fits its device (its log "
                             "says how much the smallest took)")
        return agreed, fit

    def _apply(self, trainer: pl.Trainer) -> None:
        provisional = self.plan.accumulation
        trainer.accumulate_grad_batches = self.accumulation
        trainer.datamodule.micro_batch_size = self.size
        if isinstance(trainer.val_check_interval, int):   # validation.every_n_steps, counted in passes
            trainer.val_check_interval = trainer.val_check_interval // provisional * self.accumulation
        if isinstance(trainer.strategy, DeepSpeedStrategy):
            trainer.strategy.config["train_micro_batch_size_per_gpu"] = self.size

    def _log(self) -> None:
        plan = self.plan
        shape = (f"{self.size} sequences per pass x {self.accumulation} accumulation on each of {plan.world_size} "
                 f"processes = global batch {plan.global_batch_size}")
        if plan.source == "probe":
            fit = self.fit
            log.info("data.micro_batch_size=auto: %s (probed: %d peaked at %.2f GiB with the optimizer's state, of "
                     "%.2f GiB allowed, %.0f%% of %.2f GiB; the smallest over the ranks)", shape, fit.size,
                     fit.peak_bytes / GIB, fit.budget_bytes / GIB, 100 * (1 - plan.margin), fit.total_bytes / GIB)
        elif plan.source == "record":
            log.info("data.micro_batch_size=auto, resumed: %s, as the run's %s records", shape, RECORD_NAME)
        elif plan.source == "cpu":
            log.info("data.micro_batch_size=auto without CUDA: %s (at most %d a pass on the CPU)", shape,
                     CPU_MICRO_BATCH_SIZE)
        if plan.source == "config" and plan.recorded is not None and plan.recorded != self.size:
            log.warning("resuming with %s, where the run's %s records %d sequences per pass: the rows each rank "
                        "reads after the resume point change with it", shape, RECORD_NAME, plan.recorded)

    def _record(self, trainer: pl.Trainer) -> dict[str, Any]:
        # A resume that kept the recorded size keeps how it was chosen (the probe's device and peak).
        kept = self.plan.record if self.plan.source == "record" else {"source": self.plan.source}
        record = {**kept, "micro_batch_size": self.size, "accumulation": self.accumulation,
                  "world_size": self.plan.world_size, "global_batch_size": self.plan.global_batch_size}
        if self.fit is not None:
            device = trainer.strategy.root_device
            record.update(device=torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
                          peak_bytes=self.fit.peak_bytes, total_bytes=self.fit.total_bytes, margin=self.plan.margin)
        return record
