"""A training-step guard against host-device synchronisation: the check of issue 21's item 6 and issue 35's item 1.

On a GPU a step that builds a device tensor from a Python value (`torch.tensor(x, device="cuda")`) or reads one back
(`.item()`, `.tolist()`, `float(t)`, `if t:`, `.cpu()`) waits for all the work queued before it. Neither may happen
outside the steps that log, whoever does it: our code, or Lightning reading a value we logged (it turns every
prog-bar value into a Python number at the end of every batch, after the callbacks' on_train_batch_end).

HostSyncGuard watches each micro-batch from its on_train_batch_start to the next one's (so Lightning's own batch end
is inside), except the last micro-batch of a logging step (the optimizer step whose number is a multiple of
`log_every_n_steps`), whose metrics are read back at its end:
- where CUDA exists, with torch.cuda.set_sync_debug_mode("error"): any synchronising CUDA call raises;
- on the CPU, where nothing waits, with a model of where each tensor would live on a GPU (DeviceModel, a
  TorchFunctionMode over the whole fit, so that it sees a value made at a log step and then cloned by Lightning):
  a tensor lives on the host when a factory made it without a device (torch's default device is the CPU on a GPU
  machine too: the optimizers' step counters, a learning rate made into a tensor) or in pinned memory, when it was
  copied into a tensor that lives there (`copy_`, how pipeline/core/speed/step_stats.py copies to pinned memory), or
  when `.cpu()` or `.to("cpu")` made it; and when every tensor an operation reads lives on the host, so does its result.
  Every other tensor lives on the device: the parameters, the batches, the gradients, what a factory made on a given
  device, and all that is computed from them. A read of a device tensor is recorded, whoever reads it, and so is a
  device tensor made from a Python value.
Besides reads: what makes the host wait without reading a value (issue 48's review of the guard's gaps), recorded
on the CPU too: a boolean-mask index or an op whose output size depends on the data (nonzero, masked_select, unique,
...: the host must learn the size) on a device tensor; a host tensor copied to the device by our code without
non_blocking; and the waits that are no tensor operation, wrapped for the fit: torch.cuda.synchronize, CUDA events'
and streams' synchronize, torch.distributed.barrier, and DeepSpeed's accelerator synchronize (its timers, ZeRO's
epilogues), whatever the accelerator.
Each call found is recorded (what, where, which step); `violations` lists them, and `record_to` writes them as JSON
lines for a run in another process.
"""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

REPO_ROOT = Path(__file__).resolve().parents[2]
PRODUCT_CODE = tuple(str(REPO_ROOT / package) + "/" for package in ("model", "pipeline"))
TORCH_CODE = str(Path(torch.__file__).parent) + "/"
LOADER_CODE = TORCH_CODE + "utils/data/"
LIGHTNING_DRIVERS = tuple(str(Path(pl.__file__).parent / part) + "/" for part in ("loops", "trainer"))
_READS = {"item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__"}
_FROM_HOST_VALUES = {"tensor", "as_tensor"}    # a device tensor made from Python values is a host-to-device copy
_COPIES_INTO_SELF = {"copy_", "__setitem__"}
# Ops whose output's size depends on the values: the host waits to learn it (torch.cuda.set_sync_debug_mode flags them)
_DATA_DEPENDENT_SIZE = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount"}
_INDEXING = {"__getitem__", "__setitem__", "index_put_", "index_put"}


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


def _is_host_device(device: Any) -> bool:
    """A move to the string "cpu" (`.to("cpu")`) goes to the host; any other device named, a torch.device or a string
    (`self.device`, DeepSpeed's accelerator device name, "cpu" here and "cuda:0" on a GPU machine) is taken for the
    training device."""
    return isinstance(device, str) and (device == "cpu" or device.startswith("cpu:"))


def _target_device(args: tuple, kwargs: dict) -> Any:
    return kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device))), None))


def _in_data_loader() -> bool:
    """Whether torch.utils.data is on the stack: the loader's own work (collating a batch, on the host before it is
    moved to the device), which the guard's window overlaps when Lightning fetches the next batch early."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith(LOADER_CODE):
            return True
        frame = frame.f_back
    return False


def _in_place(name: str) -> bool:
    """add_, copy_, __iadd__ ... (not __getitem__ and the other dunders, which end in "_" too)."""
    if name.startswith("__"):
        return name in _IN_PLACE_OPERATORS
    return name.endswith("_")


_IN_PLACE_OPERATORS = {f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul",
                                              "and", "or", "xor", "lshift", "rshift")}


def _boolean_mask(index: Any) -> bool:
    """x[mask] and x[mask] = v with a boolean tensor: indexing by its nonzero positions, whose count the host waits
    for."""
    return any(t.dtype == torch.bool for t in _tensors(index if isinstance(index, (list, tuple)) else [index]))


def _from_product_code() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(PRODUCT_CODE):
            return True
        if filename.startswith(LIGHTNING_DRIVERS):
            return False
        frame = frame.f_back
    return False


def caller() -> str:
    """'file:line' of the innermost frame of the pipeline's own code on the stack up to the Lightning loop that runs
    the step (the call itself, or the hook or forward it happens in), else the innermost frame outside torch and this
    file (e.g. Lightning's result collection reading a logged value)."""
    frame, fallback = sys._getframe(1), None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(PRODUCT_CODE):
            return f"{filename}:{frame.f_lineno}"
        if filename.startswith(LIGHTNING_DRIVERS):
            break
        if fallback is None and not filename.startswith(TORCH_CODE) and filename != __file__:
            fallback = f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return fallback or "?"


def outer_frames(count: int = 8) -> list[str]:
    """The innermost `count` frames outside torch and this file, as 'file:line' (who made the call, and for whom)."""
    frames, frame = [], sys._getframe(1)
    while frame is not None and len(frames) < count:
        filename = frame.f_code.co_filename
        if not filename.startswith(TORCH_CODE) and filename != __file__:
            frames.append(f"{filename}:{frame.f_lineno}")
        frame = frame.f_back
    return frames


class DeviceModel(TorchFunctionMode):
    """Where each tensor would live on a GPU (see the module docstring); records host round trips while `watching`."""

    def __init__(self):
        super().__init__()
        self._on_host = WeakIdKeyDictionary()
        self.watching: dict[str, int] | None = None   # where we are ({"step", "batch", "rank"}) while guarded
        self.violations: list[dict[str, Any]] = []

    def lives_on_host(self, tensor: torch.Tensor) -> bool:
        return tensor in self._on_host

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        inputs = _tensors(args) + _tensors(kwargs)
        if self.watching is not None:
            self._check(name, inputs, args, kwargs)
        result = func(*args, **kwargs)
        self._place(name, inputs, args, kwargs, result)
        return result

    def _check(self, name: str, inputs: list[torch.Tensor], args: tuple, kwargs: dict) -> None:
        if _in_data_loader():
            return
        if name in _READS and inputs and not self.lives_on_host(inputs[0]):
            self._record(f"Tensor.{name}")
        elif name in _FROM_HOST_VALUES and kwargs.get("device") is not None:
            self._record(f"torch.{name}")
        elif name in _DATA_DEPENDENT_SIZE and inputs and not self.lives_on_host(inputs[0]):
            self._record(f"torch.{name}")
        elif (name in _INDEXING and inputs and not self.lives_on_host(inputs[0]) and len(args) > 1
              and _boolean_mask(args[1])):
            self._record(f"Tensor.{name} (boolean mask)")
        elif name in _COPIES_INTO_SELF and inputs and self.lives_on_host(inputs[0]):
            sources = inputs[1:]
            if any(not self.lives_on_host(t) for t in sources) and not kwargs.get("non_blocking"):
                self._record(f"Tensor.{name}")
        elif (name == "to" and inputs and self.lives_on_host(inputs[0]) and not kwargs.get("non_blocking")
              and not _is_host_device(_target_device(args, kwargs) or "cpu") and _from_product_code()):
            # Lightning's batch transfer is its own (pinned memory, non_blocking on a GPU); ours must not block
            self._record("Tensor.to (host to device)")

    def _record(self, call: str) -> None:
        self.violations.append({"call": call, "at": caller(), "stack": outer_frames(), **self.watching})

    def _place(self, name: str, inputs: list[torch.Tensor], args: tuple, kwargs: dict, result: Any) -> None:
        outputs = _tensors(result)
        if not outputs:
            return
        if _in_place(name) or name in _COPIES_INTO_SELF:
            return   # in place: the tensor stays where it lives
        if name == "cpu":
            host = True
        elif name == "to":   # to(device), to(dtype), to(other tensor): a device named, or where it was
            target = _target_device(args, kwargs)
            host = _is_host_device(target) if target is not None else self.lives_on_host(inputs[0])
            if target is None and len(inputs) > 1:
                host = self.lives_on_host(inputs[1])
        elif not inputs:   # a factory: the default device (the host) unless given one; pinned memory is the host's
            host = kwargs.get("device") is None or bool(kwargs.get("pin_memory"))
        else:
            host = all(self.lives_on_host(t) for t in inputs) and kwargs.get("device") is None
        if host:
            for tensor in outputs:
                self._on_host[tensor] = True


def _wait_points() -> list[tuple[Any, str, str]]:
    """(owner, attribute, what it is) of each wait that is no tensor operation."""
    points = [(torch.cuda, "synchronize", "torch.cuda.synchronize"),
              (torch.cuda.Event, "synchronize", "torch.cuda.Event.synchronize"),
              (torch.cuda.Stream, "synchronize", "torch.cuda.Stream.synchronize"),
              (torch.distributed, "barrier", "torch.distributed.barrier")]
    if "deepspeed" in sys.modules:      # imported by the strategy: its accelerator's wait, CPU or CUDA
        from deepspeed.accelerator import get_accelerator

        points.append((type(get_accelerator()), "synchronize", "deepspeed accelerator.synchronize"))
    return points


class WaitCalls:
    """While entered, each wait of _wait_points() calls `record(what)` when `watching()` is true, then waits."""

    def __init__(self, watching, record):
        self.watching, self.record = watching, record
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> WaitCalls:
        for owner, attribute, what in _wait_points():
            original = getattr(owner, attribute)

            def wait(*args, _original=original, _what=what, **kwargs):
                if self.watching():
                    self.record(_what)
                return _original(*args, **kwargs)

            setattr(owner, attribute, wait)
            self._saved.append((owner, attribute, original))
        return self

    def __exit__(self, *exc) -> None:
        for owner, attribute, original in reversed(self._saved):
            setattr(owner, attribute, original)
        self._saved = []


class HostSyncGuard(pl.Callback):
    def __init__(self, log_every_n_steps: int, record_to: str | Path | None = None, settle_steps: int = 0):
        """settle_steps: optimizer steps at the start that are not watched (DeepSpeed ZeRO-3 checks its recorded
        parameter trace across ranks, with device reads, in its first step only)."""
        self.log_every_n_steps = log_every_n_steps
        self.settle_steps = settle_steps
        self.record_to = Path(record_to) if record_to is not None else None
        self.guarded_batches = 0
        self._model: DeviceModel | None = None
        self._cuda = False
        self._window_open = False
        self._where: dict[str, Any] = {}
        self._waits_called: list[dict[str, Any]] = []
        self._waits: WaitCalls | None = None

    @property
    def violations(self) -> list[dict[str, Any]]:
        return (self._model.violations if self._model is not None else []) + self._waits_called

    def _record_wait(self, what: str) -> None:
        self._waits_called.append({"call": what, "at": caller(), "stack": outer_frames(), **self._where})

    # -- the fit and its windows ------------------------------------------------------------------------------------

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._cuda = torch.cuda.is_available() and pl_module.device.type == "cuda"
        if not self._cuda:
            self._model = DeviceModel()
            self._model.__enter__()
        self._waits = WaitCalls(lambda: self._window_open, self._record_wait).__enter__()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._close_window()
        boundary = not trainer.fit_loop._should_accumulate()
        if boundary and (trainer.global_step + 1) % self.log_every_n_steps == 0:
            return   # the step that logs: its metrics are read back at its end
        if trainer.global_step < self.settle_steps:
            return
        self.guarded_batches += 1
        where = {"step": trainer.global_step, "batch": batch_idx, "rank": trainer.global_rank, "step_end": boundary}
        self._where = where
        self._window_open = True
        if self._cuda:
            torch.cuda.set_sync_debug_mode("error")
        else:
            self._model.watching = where

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close_window()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close_window()

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        self._close_window()   # a checkpoint is written to the host: a wait by design, at its own steps

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish()
        if self.record_to is not None:
            with open(self.record_to, "a") as handle:
                handle.write(json.dumps({"rank": trainer.global_rank, "guarded_batches": self.guarded_batches,
                                         "violations": self.violations}) + "\n")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._finish()

    @contextlib.contextmanager
    def unwatched(self):
        """A test's own instrumentation (reading each micro-batch's loss to compare runs) is no part of the step."""
        watching = self._model.watching if self._model is not None else None
        was_open = self._window_open
        self._close_window()
        try:
            yield
        finally:
            self._window_open = was_open
            if self._cuda and was_open:
                torch.cuda.set_sync_debug_mode("error")
            elif self._model is not None:
                self._model.watching = watching

    def _close_window(self) -> None:
        self._window_open = False
        if self._cuda:
            torch.cuda.set_sync_debug_mode("default")
        elif self._model is not None:
            self._model.watching = None

    def _finish(self) -> None:
        self._close_window()
        if self._waits is not None:
            self._waits.__exit__(None, None, None)
            self._waits = None
        if self._model is not None and self._model in _active_modes():
            self._model.__exit__(None, None, None)


def _active_modes() -> list[Any]:
    from torch.overrides import _get_current_function_mode_stack

    return list(_get_current_function_mode_stack())
