"""A training-step guard against host-device synchronisation: the check of issue 21's item 6.

On a GPU a step that builds a tensor from a Python value (`torch.tensor(x, device="cuda")`) or reads one back
(`.item()`, `.tolist()`, `float(t)`, `if t:`) waits for all the work queued before it. The pre-training step must do
neither outside the steps that log (which read their metrics once, at the end of the step).

HostSyncGuard watches every micro-batch from on_train_batch_start to on_train_batch_end, except the last micro-batch
of a logging step (the optimizer step whose number is a multiple of `log_every_n_steps`):
- where CUDA exists, with torch.cuda.set_sync_debug_mode("error"): any synchronising CUDA call raises;
- on the CPU, where nothing waits, by patching the calls that would copy to or from a GPU: torch.tensor and
  torch.as_tensor (a host value made into a tensor), Tensor.item, .tolist, .cpu, .numpy and the conversions to
  bool, float and int (a device value read back). A call counts when the pipeline's own code (model/, pipeline/)
  is on its stack: made by it, or by a library working for it (Lightning reading a metric for our progress bar);
  the libraries' own CPU bookkeeping outside it (torch.optim's step counters, which live on the host on a GPU too)
  is no device round trip. The CUDA mode above is the check of everything.
Each call found is recorded (what, where, which step); `violations` lists them, and `record_to` writes them as JSON
lines for a run in another process.
"""
from __future__ import annotations

import json
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable

import pytorch_lightning as pl
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
PRODUCT_CODE = tuple(str(REPO_ROOT / package) + "/" for package in ("model", "pipeline"))
LIGHTNING_DRIVERS = tuple(str(Path(pl.__file__).parent / part) + "/" for part in ("loops", "trainer"))
_TORCH_FUNCTIONS = ("tensor", "as_tensor")
_TENSOR_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")


def product_caller(depth: int = 2) -> str | None:
    """'file:line' of the innermost frame of the pipeline's own code on the stack above `depth` levels up, up to
    the Lightning loop or trainer that called into it: the call itself, or the hook or forward it happens on behalf
    of (a library reading a metric for our progress bar); not train() driving the whole loop. Else None."""
    frame = sys._getframe(depth)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(PRODUCT_CODE):
            return f"{filename}:{frame.f_lineno}"
        if filename.startswith(LIGHTNING_DRIVERS):
            return None
        frame = frame.f_back
    return None


class HostSyncGuard(pl.Callback):
    def __init__(self, log_every_n_steps: int, record_to: str | Path | None = None):
        self.log_every_n_steps = log_every_n_steps
        self.record_to = Path(record_to) if record_to is not None else None
        self.violations: list[dict[str, Any]] = []
        self.guarded_batches = 0
        self._patches: ExitStack | None = None
        self._where: dict[str, int] = {}

    # -- the window ---------------------------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        boundary = not trainer.fit_loop._should_accumulate()
        if boundary and (trainer.global_step + 1) % self.log_every_n_steps == 0:
            return   # the step that logs: its metrics are read back at its end
        self._where = {"step": trainer.global_step, "batch": batch_idx, "rank": trainer.global_rank}
        self.guarded_batches += 1
        if torch.cuda.is_available() and pl_module.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")
            self._patches = ExitStack()
            self._patches.callback(torch.cuda.set_sync_debug_mode, "default")
        else:
            self._patches = self._patch_cpu()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._close()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close()
        if self.record_to is not None:
            with open(self.record_to, "a") as handle:
                handle.write(json.dumps({"rank": trainer.global_rank, "guarded_batches": self.guarded_batches,
                                         "violations": self.violations}) + "\n")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._close()

    def _close(self) -> None:
        if self._patches is not None:
            self._patches.close()
            self._patches = None

    # -- the CPU patches ----------------------------------------------------------------------------------------

    def _patch_cpu(self) -> ExitStack:
        stack = ExitStack()
        for name in _TORCH_FUNCTIONS:
            self._patch(stack, torch, name, f"torch.{name}")
        for name in _TENSOR_METHODS:
            self._patch(stack, torch.Tensor, name, f"Tensor.{name}")
        return stack

    def _patch(self, stack: ExitStack, owner: Any, name: str, label: str) -> None:
        original: Callable = getattr(owner, name)
        guard = self

        def watched(*args: Any, **kwargs: Any) -> Any:
            caller = product_caller()
            if caller is not None:
                guard.violations.append({"call": label, "at": caller, **guard._where})
            return original(*args, **kwargs)

        own = name in vars(owner)   # torch.Tensor inherits most of these from torch._C.TensorBase
        setattr(owner, name, watched)
        stack.callback(setattr, owner, name, original) if own else stack.callback(delattr, owner, name)
