"""Where one optimizer step of a real training run spends its time: gpu_check.py's profile of a step (issue 35, item 9).

StepProfileProbe profiles every micro-batch of one optimizer step (step 2: the first ones pay one-time set-up and
compilation, and gpu_probes.py profiles micro-batch 1; on a GPU the step lies in the first throughput window, which
gpu_check's figures leave out) and summarises:
- GPU busy: the union of the CUDA kernels' intervals over the step's wall time (the host's view, synchronised at
  both ends): what is left is the GPU waiting for the host (launch overhead, host syncs, the loader);
- kernel launches per micro-batch: the runtime's launch calls (cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch:
  a CUDA graph's replay is one) over the step's micro-batches;
- time by kernel class: the kernels' summed time by what they do (`kernel_class`: matmul, attention, fused by the
  compiler, element-wise, normalisation and reductions, communication, copies, optimizer);
- host syncs per micro-batch: torch.cuda.set_sync_debug_mode("warn") over the step, each warning counted (what the
  step waits for the GPU: a `.item()`, a host-to-device copy from pageable memory, a synchronising call).
On the CPU (the rehearsal) there are no kernels: the time by class is the aten operators' own CPU time by the same
classes, and GPU busy, launches and syncs say "n/a".
"""
from __future__ import annotations

import time
import warnings
from collections import Counter
from typing import Any

import pytorch_lightning as pl
import torch

LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cudaGraphLaunch", "cuLaunchKernelEx")
# (class, substrings of a kernel's or operator's name, lower case), first match wins: the order matters (a compiled
# kernel's name lists the operators it fused, e.g. triton_per_fused_add_native_layer_norm_0).
CLASSES = (
    ("communication", ("nccl", "allreduce", "all_reduce", "reduce_scatter", "allgather", "broadcast")),
    ("optimizer", ("multi_tensor", "foreach", "adam", "lamb")),
    ("fused by the compiler", ("triton", "cpp_fused", "fused_")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn_attn", "scaled_dot_product")),
    ("matmul", ("gemm", "matmul", "addmm", "aten::mm", "aten::bmm", "cutlass", "sm90_xmma", "nvjet", "linear")),
    ("normalisation and reductions", ("layer_norm", "layernorm", "softmax", "reduce", "norm", "sum", "mean")),
    ("copies", ("memcpy", "memset", "copy", "cat", "index", "gather", "scatter", "to_copy", "embedding")),
    ("element-wise", ("elementwise", "vectorized", "gelu", "dropout", "add", "mul", "fill", "where", "bernoulli",
                      "tanh", "unrolled")),
)


def kernel_class(name: str) -> str:
    lowered = name.lower()
    return next((cls for cls, keys in CLASSES if any(key in lowered for key in keys)), "other")


def busy_share(intervals: list[tuple[float, float]], wall_us: float) -> float:
    """The union of [start, end) intervals (µs) over the wall time."""
    busy, end_so_far = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= end_so_far:
            continue
        busy += end - max(start, end_so_far)
        end_so_far = end
    return busy / wall_us if wall_us > 0 else 0.0


def summarise_profile(events: list[Any], wall_s: float, micro_batches: int, syncs: int | None) -> dict:
    """The summary above from a profiler's FunctionEvents (torch.autograd.profiler_util)."""
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    by_class: Counter = Counter()
    if kernels:
        for kernel in kernels:
            by_class[kernel_class(kernel.name)] += kernel.time_range.elapsed_us()
        intervals = [(k.time_range.start, k.time_range.end) for k in kernels]
        launches = sum(1 for e in events if e.name in LAUNCH_CALLS)
        gpu = {"gpu_busy": busy_share(intervals, wall_s * 1e6), "launches_per_micro_batch": launches / micro_batches,
               "syncs_per_micro_batch": None if syncs is None else syncs / micro_batches}
    else:   # the CPU: the aten operators' own time (their children's not counted twice)
        for event in events:
            if event.name.startswith("aten::"):
                by_class[kernel_class(event.name)] += event.self_cpu_time_total
        gpu = {"gpu_busy": None, "launches_per_micro_batch": None, "syncs_per_micro_batch": None}
    total = sum(by_class.values()) or 1.0
    return {"micro_batches": micro_batches, "wall_ms": wall_s * 1e3, **gpu,
            "time_by_class": {cls: by_class[cls] / total for cls, _ in by_class.most_common()},
            "measured_on": "CUDA kernels" if kernels else "CPU operators"}


class StepProfileProbe(pl.Callback):
    def __init__(self, step: int = 2):
        self.step = step
        self.summary: dict | None = None
        self._profiler: torch.profiler.profile | None = None
        self._warnings: Any = None
        self._recorded: list | None = None
        self._started = 0.0
        self._micro_batches = 0

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._profiler is not None or self.summary is not None or trainer.global_step != self.step:
            return
        cuda = pl_module.device.type == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        if cuda:
            torch.cuda.synchronize()
            self._warnings = warnings.catch_warnings(record=True)
            self._recorded = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        self._profiler = torch.profiler.profile(activities=activities)
        self._profiler.start()
        self._started, self._micro_batches = time.perf_counter(), 0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._profiler is None:
            return
        self._micro_batches += 1
        if trainer.global_step == self.step:
            return   # the step's later micro-batches
        syncs = None
        if pl_module.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
            syncs = sum(1 for w in self._recorded if "synchroniz" in str(w.message))
            self._warnings.__exit__(None, None, None)
        wall = time.perf_counter() - self._started
        self._profiler.stop()
        try:
            self.summary = summarise_profile(list(self._profiler.events()), wall, self._micro_batches, syncs)
        except Exception as error:   # a profile that cannot be read must not cost the row its figures
            self.summary = {"error": f"{type(error).__name__}: {error}"}
        self._profiler = None


def profile_lines(summary: dict | None) -> str:
    """One table cell set: GPU busy | launches / micro-batch | syncs / micro-batch | time by class."""
    if not summary:
        return "- | - | - | -"
    if "error" in summary:
        return f"profile failed: {summary['error']} | | |"

    def number(key: str, fmt: str) -> str:
        value = summary.get(key)
        return "n/a" if value is None else format(value, fmt)

    classes = ", ".join(f"{cls} {share:.0%}" for cls, share in summary["time_by_class"].items() if share >= 0.005)
    return (f"{number('gpu_busy', '.0%')} | {number('launches_per_micro_batch', ',.0f')} | "
            f"{number('syncs_per_micro_batch', '.1f')} | {classes} ({summary['measured_on']})")
