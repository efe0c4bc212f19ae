"""Throughput and model FLOPs utilisation, logged every N optimizer steps over the steps since the last log.

    perf/tokens_per_s          non-padding tokens per second, all ranks
    perf/padded_tokens_per_s   tokens including padding (what the hardware computes on), all ranks
    perf/sequences_per_s       sequences per second, all ranks
    perf/mfu                   model FLOPs / s over the peak of all devices (model.flops_per_token at each batch's
                               padded length and number of predictions; for a fine-tuning batch, without MLM
                               labels, the encoder and pooler only: a task head's few FLOPs are left out); only
                               with a known peak

The peak FLOP/s of one device: callbacks.throughput.peak_flops (a number, or a key of model.PEAK_FLOPS), else
looked up from the CUDA device name (model.peak_flops_for_device), else none and no MFU (the CPU). The table's
peaks are dense bf16 tensor-core figures: an fp32 run's MFU against them reads low, as it should.

Counts stay on the device between logs; the window's wall time is closed with a device synchronisation only at
the log step, so the callback costs no host sync on other steps.
"""
from __future__ import annotations

import time
from typing import Any

import pytorch_lightning as pl
import torch

from model import PEAK_FLOPS, flops_per_token, peak_flops_for_device


def resolve_peak_flops(peak_flops: float | str | None, device: torch.device) -> float | None:
    if peak_flops is not None:
        if isinstance(peak_flops, str):
            if peak_flops in PEAK_FLOPS:
                return PEAK_FLOPS[peak_flops]
            try:
                return float(peak_flops)
            except ValueError:
                raise ValueError(f"callbacks.throughput.peak_flops={peak_flops!r} is neither FLOP/s nor one of "
                                 f"{', '.join(PEAK_FLOPS)}") from None
        return float(peak_flops)
    if device.type == "cuda":
        return peak_flops_for_device(torch.cuda.get_device_name(device))
    return None


class ThroughputMonitor(pl.Callback):
    def __init__(self, log_every_n_steps: int = 10, peak_flops: float | str | None = None):
        if log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps must be >= 1, got {log_every_n_steps}")
        self.log_every_n_steps = log_every_n_steps
        self.peak_flops_setting = peak_flops
        self.peak_flops: float | None = None
        self._counts: torch.Tensor | None = None   # [tokens, padded tokens, sequences] since the last log
        self._flops = 0.0                          # model FLOPs since the last log (host arithmetic on shapes only)
        self._window_start: float | None = None
        self._last_step = -1

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.peak_flops = resolve_peak_flops(self.peak_flops_setting, pl_module.device)
        self._reset(trainer)

    def _reset(self, trainer: pl.Trainer) -> None:
        self._counts, self._flops = None, 0.0
        self._window_start = time.perf_counter()
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        input_ids = batch["input_ids"]
        sequences, seq_len = input_ids.shape
        mask = batch.get("attention_mask")
        tokens = mask.sum() if mask is not None else torch.tensor(input_ids.numel(), device=input_ids.device)
        counts = torch.stack([tokens.to(torch.float64), torch.tensor(float(input_ids.numel()), dtype=torch.float64,
                                                                      device=tokens.device),
                              torch.tensor(float(sequences), dtype=torch.float64, device=tokens.device)])
        self._counts = counts if self._counts is None else self._counts + counts
        positions = batch.get("masked_positions")
        if positions is not None:
            predictions = positions.shape[1]
        else:   # (B, T) MLM labels score every position; a fine-tuning batch (task labels) has no MLM head at all
            predictions = seq_len if "masked_lm_labels" in batch else 0
        self._flops += flops_per_token(pl_module.model.config, seq_len, predictions) * input_ids.numel()

        step = trainer.global_step
        if step == self._last_step or step % self.log_every_n_steps != 0:
            return   # inside an accumulation cycle, or not a log step
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        elapsed = max(time.perf_counter() - self._window_start, 1e-9)
        totals = trainer.strategy.reduce(self._counts, reduce_op="sum")
        flops = float(trainer.strategy.reduce(torch.tensor(self._flops, dtype=torch.float64,
                                                           device=pl_module.device), reduce_op="sum"))
        tokens_s, padded_s, sequences_s = (totals / elapsed).tolist()
        metrics = {"perf/tokens_per_s": tokens_s, "perf/padded_tokens_per_s": padded_s,
                   "perf/sequences_per_s": sequences_s}
        if self.peak_flops:
            metrics["perf/mfu"] = flops / elapsed / (self.peak_flops * trainer.world_size)
        pl_module.log_dict(metrics, on_step=True, on_epoch=False)
        self._reset(trainer)
