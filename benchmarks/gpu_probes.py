"""What gpu_check.py measures inside a real training run besides the throughput callback: which kernel of
torch.nn.functional.scaled_dot_product_attention ran, and the peak memory.

The SDPA backend is read from the operators a profiled training step dispatched. SDPA's dispatcher calls one
private operator per backend (flash, memory-efficient, cuDNN, math, the CPU's flash); the profiler's CPU activity
records those operator calls on every device, CUDA included, so the same code tells the backend on a GPU and in
the CPU check, without guessing from the inputs which kernel SDPA would have picked.
"""
from __future__ import annotations

import resource
from collections.abc import Iterable
from typing import Any

import pytorch_lightning as pl
import torch

# aten operator -> SDPA backend (torch.nn.attention.SDPBackend's names, in words).
SDPA_OPERATORS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU kernel)",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "fused (another device's)",
}
NO_SDPA = "no SDPA call"


def attention_backends(operator_names: Iterable[str]) -> str:
    """The SDPA backends among a profile's operator names, e.g. 'memory-efficient'; NO_SDPA where none ran
    (model/bert/model.py's own attention with dropout on the CPU, for instance)."""
    found = sorted({SDPA_OPERATORS[name] for name in operator_names if name in SDPA_OPERATORS})
    return ", ".join(found) if found else NO_SDPA


class AttentionBackendProbe(pl.Callback):
    """Profiles one training micro-batch (forward, backward and, on a step boundary, the optimizer step) and keeps
    the SDPA backends it used in `backends`. Batch 1, not 0: the first one also pays one-time set-up, and the
    profiled batch is slower, which only the first throughput window (left out of gpu_check's figures) sees."""

    def __init__(self, batch_index: int = 1):
        self.batch_index = batch_index
        self.backends: str | None = None
        self._profiler: torch.profiler.profile | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if batch_idx == self.batch_index and self.backends is None and self._profiler is None:
            self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self._profiler.start()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._profiler is None:
            return
        self._profiler.stop()
        self.backends = attention_backends(event.name for event in self._profiler.events())
        self._profiler = None


def peak_memory() -> tuple[int, str]:
    """(bytes, what they are): torch.cuda.max_memory_allocated on a GPU, else this process's peak resident set
    (Linux reports ru_maxrss in KiB)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated(), "torch.cuda.max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "peak RSS of the process"
