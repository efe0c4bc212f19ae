"""Training strategies: a `conf/training/strategy/*.yaml` file (+ trainer and data settings) -> a Lightning strategy.

    auto                     -> "auto" (Lightning picks: one device, or DDP)
    ddp                      -> DDPStrategy, gloo on CPU / nccl on CUDA, find_unused_parameters=False
    deepspeed_stage_{1,2,3}, deepspeed_stage_{2,3}_offload
                             -> DeepSpeedStrategy(config=<full DeepSpeed config>), or CPUDeepSpeedStrategy on CPU
                                (pipeline/core/speed/cpu_deepspeed.py); both write complete-or-absent checkpoints
                                (pipeline/core/checkpoints/deepspeed_checkpoints.py)

Every strategy trains with the same optimizer, parameter groups and schedule: the LightningModule's
`configure_optimizers` (pipeline/core/optim/optimizers.py: no weight decay on biases and LayerNorm, as
google-research/bert, and the pipeline's LambdaLR schedule, stepped once per optimizer step). DeepSpeed wraps that
optimizer (ZeRO partitions its state) and steps that scheduler; its own config never holds an optimizer or scheduler
section, which would be one parameter group (weight decay on every parameter) and DeepSpeed's own schedule. Under
ZeRO-Offload the optimizer step runs on the CPU, so the optimizer built for it is DeepSpeedCPUAdam over the same groups
(`offloads_optimizer`).

The DeepSpeed config is built by `deepspeed_config`, a pure function, from one place each:
    ZeRO section, buckets, offload      <- the strategy file (`zero_optimization`, verbatim)
    precision sections                  <- the Trainer's precision (`precision_sections`, below)
    gradient_clipping                   <- the training config's gradient_clip_val
    train_micro_batch_size_per_gpu      <- the data config's per-device batch size
    gradient_accumulation_steps         <- the Trainer's accumulate_grad_batches
    timers                              <- always off (_TIMERS_OFF: no device synchronize per micro-batch)

bf16-mixed under DeepSpeed trains with DDP's numerics. DeepSpeed's own bf16 mode (`bf16.enabled`) is not mixed
precision as torch.autocast is: it casts the parameters to bf16 in place, runs the whole forward in bf16
(Lightning's DeepSpeed precision plugin opens no autocast), and accumulates and reduces the gradients in bf16. So
bf16-mixed is built on DeepSpeed's `torch_autocast` section instead: the parameters stay fp32, the forward runs
under torch.autocast(bfloat16) exactly as Lightning's bf16-mixed does under DDP (the matmuls in bf16, what autocast
keeps in fp32 in fp32), and the gradients are fp32, accumulated and reduced in fp32 (`lower_precision_safe_modules:
[]`: no parameter is marked for bf16 communication; `communication_data_type` and `data_types.grad_accum_dtype` say
fp32 besides). The cost against DeepSpeed's bf16 mode: 2 more bytes for each parameter a rank holds (all of them
under ZeRO-1/2, as under DDP; its partition under ZeRO-3), and under ZeRO-3 parameter all-gathers of fp32, twice the
bytes (autocast casts each weight to bf16 for its matmul as it does under DDP). bf16-true is DeepSpeed's bf16 mode
(bf16 weights, forward and gradients, as that precision means; the optimizer keeps fp32 master weights, which the
export takes). Its gradients stay bf16: DeepSpeed's fp32 accumulation would switch ZeRO-1 to its BF16_Optimizer,
whose checkpoints zero_to_fp32 cannot consolidate. 16-mixed is DeepSpeed's fp16 mode with dynamic loss scaling,
unchanged.
"""
from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import pytorch_lightning as pl

# Lightning (and the strategy classes built on it) is imported where a strategy is built, not here: the pre-flight
# checks import check_strategy_config, and a refusal, or the workflow's check of every stage before it launches any,
# should not pay `import pytorch_lightning` (about 4.5 CPU-seconds beyond torch's).

STRATEGY_NAMES = ("auto", "ddp", "deepspeed")

# Keys each kind of strategy file may hold; anything else is a typo and is refused.
_STRATEGY_KEYS = {
    "auto": {"name"},
    "ddp": {"name", "find_unused_parameters", "gradient_as_bucket_view", "static_graph", "process_group_backend"},
    "deepspeed": {"name", "zero_optimization", "zero_allow_untested_optimizer", "loss_scaling", "steps_per_print",
                  "wall_clock_breakdown"},
}
_LOSS_SCALING_KEYS = {"initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale"}

# Trainer precision -> DeepSpeed's mode: "autocast" (torch.autocast in bf16 over fp32 parameters, DDP's bf16-mixed),
# "bf16" / "fp16" (DeepSpeed casts the parameters), or None (fp32). Lightning reads "bf16" and "16" as the -mixed ones.
_PRECISIONS = {
    "bf16-mixed": "autocast", "bf16": "autocast", "bf16-true": "bf16",
    "16-mixed": "fp16", "16-true": "fp16", "16": "fp16",
    "32-true": None, "32": None,
}
# What torch.autocast in bf16 needs from DeepSpeed: no module's parameters communicated in bf16 (DeepSpeed's default
# list, torch.nn.Linear among them, would reduce their gradients in bf16), and fp32 gradient accumulation and
# communication stated outright. Under torch_autocast DeepSpeed 0.19.8 takes the reduction dtype from each parameter
# (its comm_dtype mark, else its own dtype: fp32 here), not from communication_data_type: the all-reduces
# tests/core/test_zero_reduction.py counts are fp32.
_AUTOCAST_BF16 = {"torch_autocast": {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}}
_FP32_GRADIENTS = {"communication_data_type": "fp32", "data_types": {"grad_accum_dtype": "fp32"}}
# DeepSpeed's throughput timer is on unless its config says otherwise, and calls the accelerator's synchronize() in
# every engine forward and every engine.step() (0.19.8: runtime/engine.py tput_timer, utils/timer.py ThroughputTimer):
# a host wait for the GPU twice per micro-batch, for a samples/s figure the throughput callback measures anyway.
_TIMERS_OFF = {"timers": {"throughput": {"enabled": False, "synchronized": False}}}


def _plain(cfg: Any) -> dict[str, Any]:
    """A DictConfig (resolved) or Mapping as a plain dict."""
    if cfg is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf
        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if not isinstance(cfg, Mapping):
        raise TypeError(f"expected a mapping, got {type(cfg).__name__}: {cfg!r}")
    return {k: (_plain(v) if isinstance(v, Mapping) else v) for k, v in cfg.items()}


def _checked_strategy_cfg(strategy_cfg: Any) -> dict[str, Any]:
    cfg = _plain(strategy_cfg)
    name = cfg.get("name")
    if name not in STRATEGY_NAMES:
        raise ValueError(f"strategy.name must be one of {STRATEGY_NAMES}, got {name!r}")
    unknown = set(cfg) - _STRATEGY_KEYS[name]
    if unknown:
        raise ValueError(f"unknown keys for a {name!r} strategy: {sorted(unknown)}; "
                         f"allowed: {sorted(_STRATEGY_KEYS[name])}")
    return cfg


def resolve_accelerator(accelerator: str = "auto") -> str:
    """'cpu' or 'cuda': the device the strategy will run on ('gpu' is Lightning's alias of 'cuda')."""
    accelerator = {"gpu": "cuda"}.get(accelerator, accelerator)
    if accelerator == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if accelerator not in ("cpu", "cuda"):
        raise ValueError(f"accelerator must be 'auto', 'cpu', 'cuda' or 'gpu', got {accelerator!r}")
    return accelerator


def precision_sections(precision: str | int, loss_scaling: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The precision sections for a Trainer precision (see the module docstring): bf16-mixed -> torch_autocast in
    bf16 with fp32 gradients; bf16-true -> DeepSpeed's bf16 mode; 16-mixed -> fp16 with dynamic loss scaling
    (loss_scale 0); 32 -> neither. `bf16` and `fp16` are always present, so Lightning adds nothing of its own."""
    key = str(precision)
    if key not in _PRECISIONS:
        raise ValueError(f"precision {precision!r} is not supported with DeepSpeed; use one of {sorted(_PRECISIONS)}")
    mode = _PRECISIONS[key]
    fp16_section: dict[str, Any] = {"enabled": False}
    if mode == "fp16":
        scaling = dict(loss_scaling or {})
        unknown = set(scaling) - _LOSS_SCALING_KEYS
        missing = _LOSS_SCALING_KEYS - set(scaling)
        if unknown or missing:
            raise ValueError(f"strategy.loss_scaling needs exactly {sorted(_LOSS_SCALING_KEYS)} "
                             f"(missing {sorted(missing)}, unknown {sorted(unknown)})")
        fp16_section = {"enabled": True, "loss_scale": 0, **{k: scaling[k] for k in sorted(_LOSS_SCALING_KEYS)}}
    sections: dict[str, Any] = {"bf16": {"enabled": mode == "bf16"}, "fp16": fp16_section}
    if mode == "autocast":
        sections.update(copy.deepcopy(_AUTOCAST_BF16))
    if mode == "autocast":
        sections.update(copy.deepcopy(_FP32_GRADIENTS))
    return sections


def deepspeed_config(strategy_cfg: Any, *, precision: str | int, gradient_clip_val: float | None,
                     micro_batch_size: int, accumulate_grad_batches: int) -> dict[str, Any]:
    """The full DeepSpeed config dict for a `deepspeed` strategy file. Pure: no DeepSpeed import, no environment."""
    cfg = _checked_strategy_cfg(strategy_cfg)
    if cfg["name"] != "deepspeed":
        raise ValueError(f"deepspeed_config needs a deepspeed strategy, got name={cfg['name']!r}")
    if int(micro_batch_size) < 1 or int(accumulate_grad_batches) < 1:
        raise ValueError(f"micro_batch_size and accumulate_grad_batches must be >= 1, "
                         f"got {micro_batch_size}, {accumulate_grad_batches}")
    zero = cfg.get("zero_optimization")
    if not isinstance(zero, dict) or zero.get("stage") not in (0, 1, 2, 3):
        raise ValueError(f"strategy.zero_optimization.stage must be 0, 1, 2 or 3, got {zero!r}")
    if gradient_clip_val is not None and gradient_clip_val < 0:
        raise ValueError(f"gradient_clip_val must be >= 0 or None, got {gradient_clip_val}")

    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": int(micro_batch_size),
        "gradient_accumulation_steps": int(accumulate_grad_batches),
        "gradient_clipping": float(gradient_clip_val or 0.0),    # 0: no clipping
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": bool(cfg.get("zero_allow_untested_optimizer", True)),
        "steps_per_print": int(cfg.get("steps_per_print", 1000)),
        "wall_clock_breakdown": bool(cfg.get("wall_clock_breakdown", False)),
        **copy.deepcopy(_TIMERS_OFF),
        **precision_sections(precision, cfg.get("loss_scaling")),
    }
    return config


def check_strategy_config(strategy_cfg: Any, *, precision: str | int, gradient_clip_val: float | None,
                          micro_batch_size: int, accumulate_grad_batches: int) -> None:
    """Refuse a strategy that build_strategy would refuse with these settings, without building it (no process
    group, no device): its keys, and for DeepSpeed the whole config (precision, ZeRO section, batch)."""
    cfg = _checked_strategy_cfg(strategy_cfg)
    if cfg["name"] == "deepspeed":
        deepspeed_config(cfg, precision=precision, gradient_clip_val=gradient_clip_val,
                         micro_batch_size=micro_batch_size, accumulate_grad_batches=accumulate_grad_batches)


def offloads_optimizer(strategy: Any) -> bool:
    """Whether a built strategy runs the optimizer step on the CPU (DeepSpeed ZeRO-Offload): the optimizer it takes
    must then be DeepSpeedCPUAdam (DeepSpeed refuses others there)."""
    from pytorch_lightning.strategies import DeepSpeedStrategy

    if not isinstance(strategy, DeepSpeedStrategy):
        return False
    offload = (strategy.config.get("zero_optimization") or {}).get("offload_optimizer") or {}
    return offload.get("device", "none") not in ("none", None)


def build_strategy(strategy_cfg: Any, *, precision: str | int, gradient_clip_val: float | None,
                   micro_batch_size: int, accumulate_grad_batches: int,
                   accelerator: str = "auto", world_size: int = 0) -> str | pl.strategies.Strategy:
    """The Lightning strategy for a `conf/training/strategy/*.yaml` config. Pass the same precision, gradient_clip_val
    and accumulate_grad_batches to the Trainer: Lightning sets `gradient_accumulation_steps` in the DeepSpeed config
    itself (from Trainer(accumulate_grad_batches)) and refuses a config that already has it, so it is left out here.
    world_size: the run's processes, where known (0: not known). strategy=ddp on one process is Lightning's
    single-device strategy: DDP there has nothing to all-reduce, yet copies every gradient into its buckets and makes
    a compiled model's graph split at each bucket (Dynamo's DDP optimizer); the checkpoints are the same.
    """
    from pytorch_lightning.strategies import DDPStrategy

    from pipeline.core.checkpoints.deepspeed_checkpoints import CompleteCheckpointsDeepSpeedStrategy
    from pipeline.core.speed.cpu_deepspeed import CPUDeepSpeedStrategy

    cfg = _checked_strategy_cfg(strategy_cfg)
    device = resolve_accelerator(accelerator)
    if cfg["name"] == "auto" or (cfg["name"] == "ddp" and world_size == 1):
        return "auto"
    if cfg["name"] == "ddp":
        return DDPStrategy(
            process_group_backend=cfg.get("process_group_backend") or ("nccl" if device == "cuda" else "gloo"),
            find_unused_parameters=bool(cfg.get("find_unused_parameters", False)),
            gradient_as_bucket_view=bool(cfg.get("gradient_as_bucket_view", True)),
            static_graph=bool(cfg.get("static_graph", False)),
        )
    config = deepspeed_config(cfg, precision=precision, gradient_clip_val=gradient_clip_val,
                              micro_batch_size=micro_batch_size, accumulate_grad_batches=accumulate_grad_batches)
    del config["gradient_accumulation_steps"]
    if device == "cpu":
        # DeepSpeed picks its accelerator once, at import; without CUDA it falls back to CPU anyway.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        return CPUDeepSpeedStrategy(config=config, process_group_backend="gloo")
    return CompleteCheckpointsDeepSpeedStrategy(config=config, process_group_backend="nccl")
