"""Throughput and model FLOPs utilisation, logged every N optimizer steps over the steps since the last log.

    perf/tokens_per_s          non-padding tokens per second, all ranks
    perf/padded_tokens_per_s   tokens including padding (what the hardware computes on), all ranks
    perf/sequences_per_s       sequences per second, all ranks (under data.packing the sentence pairs, not the rows
                               they are packed into: counted on the device, as the tokens are)
    perf/mfu                   model FLOPs / s over the peak of all devices (model.batch_flops at each batch's
                               padded length and number of predictions, the encoder's dense layers at the real
                               tokens only under data.unpad; for a fine-tuning batch, without MLM
                               labels, the encoder and pooler only: a task head's few FLOPs are left out); only
                               with a known peak. A run with model.fp8: against the FP8 peak (model.FP8_OVER_BF16
                               times the bf16 one), the precision its encoder's matmuls run in
    perf/mfu_bf16              FP8 runs only: the same FLOPs against the bf16 peak (their bf16-equivalent MFU)

The peak FLOP/s of one device: callbacks.throughput.peak_flops (a number, or a key of model.PEAK_FLOPS), else
looked up from the CUDA device name (model.peak_flops_for_device), else none and no MFU (the CPU). The table's
peaks are dense bf16 tensor-core figures: an fp32 run's MFU against them reads low, as it should.

No host sync on other steps than the log step: the counts known from shapes (padded tokens, sequences, FLOPs) are
summed on the host; the one count that needs the data, the non-padding tokens (attention_mask.sum(), or the
shape's count for a batch without a mask), is summed on the device. At the log step the window's wall time is closed
with a device synchronisation and the sums are reduced over the ranks in one collective.
"""
from __future__ import annotations

import time
from typing import Any

import pytorch_lightning as pl
import torch

from model import PEAK_FLOPS, batch_flops, peak_flops_for_device
from model.flops import FP8_OVER_BF16
from model.shared.outputs import IGNORE_INDEX


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
    def __init__(self, log_every_n_steps: int = 10, peak_flops: float | str | None = None, fp8: bool = False):
        if log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps must be >= 1, got {log_every_n_steps}")
        self.log_every_n_steps = log_every_n_steps
        self.peak_flops_setting = peak_flops
        self.fp8 = fp8   # model.fp8: MFU against the FP8 peak, the bf16-equivalent beside it
        self.peak_flops: float | None = None
        self._tokens: torch.Tensor | int = 0       # non-padding tokens since the last log (on the device)
        self._shape_counts = [0, 0, 0.0]           # [padded tokens, sequences, model FLOPs] since the last log (host)
        self._packed_sequences: torch.Tensor | int = 0   # data.packing: pairs since the last log (on the device)
        self._window_start: float | None = None
        self._last_step = -1

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.peak_flops = resolve_peak_flops(self.peak_flops_setting, pl_module.device)
        self._reset(trainer)

    def _reset(self, trainer: pl.Trainer) -> None:
        self._tokens, self._shape_counts, self._packed_sequences = 0, [0, 0, 0.0], 0
        self._window_start = time.perf_counter()
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        input_ids = batch["input_ids"]
        sequences, seq_len = input_ids.shape
        mask = batch.get("attention_mask")
        # A Python int added to a device tensor is a kernel argument, no copy.
        self._tokens = self._tokens + (mask.sum() if mask is not None else input_ids.numel())
        positions = batch.get("masked_positions")
        if positions is not None:
            predictions = positions.shape[1]
        else:   # (B, T) MLM labels score every position; a fine-tuning batch (task labels) has no MLM head at all
            predictions = seq_len if "masked_lm_labels" in batch else 0
        token_index = batch.get("token_index")   # data.unpad: the encoder's dense layers ran on these tokens only
        flops = batch_flops(pl_module.model.config, sequences, seq_len, predictions,
                            computed_tokens=token_index.shape[0] if token_index is not None else None)
        packed_labels = batch.get("next_sentence_labels") if "cls_positions" in batch else None
        if packed_labels is not None:   # packed rows (data.packing): a sequence is a pair, one per labelled slot
            self._packed_sequences = self._packed_sequences + (packed_labels != IGNORE_INDEX).sum()
        for slot, count in enumerate((input_ids.numel(), 0 if packed_labels is not None else sequences, flops)):
            self._shape_counts[slot] += count

        step = trainer.global_step
        if step == self._last_step or step % self.log_every_n_steps != 0:
            return   # inside an accumulation cycle, or not a log step
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        elapsed = max(time.perf_counter() - self._window_start, 1e-9)
        counts = torch.tensor([0.0, *self._shape_counts], dtype=torch.float64, device=pl_module.device)
        counts[0] = self._tokens   # a device tensor, or an int for batches without masks
        counts[2] += self._packed_sequences
        tokens, padded, sequences, flops = trainer.strategy.reduce(counts, reduce_op="sum").tolist()
        tokens_s, padded_s, sequences_s = tokens / elapsed, padded / elapsed, sequences / elapsed
        metrics = {"perf/tokens_per_s": tokens_s, "perf/padded_tokens_per_s": padded_s,
                   "perf/sequences_per_s": sequences_s}
        if self.peak_flops:
            bf16_mfu = flops / elapsed / (self.peak_flops * trainer.world_size)
            metrics["perf/mfu"] = bf16_mfu / FP8_OVER_BF16 if self.fp8 else bf16_mfu
            if self.fp8:
                metrics["perf/mfu_bf16"] = bf16_mfu
        pl_module.log_dict(metrics, on_step=True, on_epoch=False)
        self._reset(trainer)
