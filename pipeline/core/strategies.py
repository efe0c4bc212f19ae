"""Training strategies: a `conf/training/strategy/*.yaml` file (+ trainer, data and optimizer settings) -> a Lightning strategy.

    auto                     -> "auto" (Lightning picks: one device, or DDP)
    ddp                      -> DDPStrategy, gloo on CPU / nccl on CUDA, find_unused_parameters=False
    deepspeed_stage_{1,2,3}, deepspeed_stage_{2,3}_offload
                             -> DeepSpeedStrategy(config=<full DeepSpeed config>), or CPUDeepSpeedStrategy on CPU
                                (pipeline/core/cpu_deepspeed.py)

The DeepSpeed config is built by `deepspeed_config`, a pure function, from one place each:
    ZeRO section, buckets, offload      <- the strategy file (`zero_optimization`, verbatim)
    bf16 / fp16 (+ dynamic loss scale)  <- the Trainer's precision
    gradient_clipping                   <- the training config's gradient_clip_val
    train_micro_batch_size_per_gpu      <- the data config's per-device batch size
    gradient_accumulation_steps         <- the Trainer's accumulate_grad_batches
    optimizer, scheduler                <- the optimizer config (see `optimizer_section`, `scheduler_section`)

Optimizer and scheduler live in the DeepSpeed config (`optimizer_in_ds_config: true`, the default), so DeepSpeed
builds its own optimizer: on CUDA FusedAdam for AdamW (DeepSpeedCPUAdam when the optimizer state is offloaded) and
FusedLamb for LAMB (ZeRO stage 0 only: ZeRO hands the optimizer flat partitions of many tensors, which breaks
LAMB's per-tensor trust ratio, and DeepSpeed does not list LAMB as ZeRO-supported). The LightningModule's
`configure_optimizers` is then never called (it must still exist: Lightning checks that it is defined).

The scheduler is therefore given to DeepSpeed too, as WarmupDecayLR, and not left to Lightning: once the DeepSpeed
config holds the optimizer, Lightning does not call `configure_optimizers`, so no Lightning-side scheduler can
exist. WarmupDecayLR with warmup_type linear is BERT's schedule (linear warm-up from 0 to lr, linear decay to 0 at
`total_steps`). Lightning takes the DeepSpeed scheduler over and steps it once per optimizer step, after
gradient accumulation, so `total_steps` counts optimizer steps like trainer.max_steps. It is set up so that
optimizer step k (0-based) runs at lr * factor(k) exactly as google-research/bert and pipeline/core/optim.py do
(k / warmup, then (total - k) / (total - warmup)): the optimizer section starts at lr 0.0 (= factor(0)) and the
scheduler at `last_batch_iteration: 0`; DeepSpeed's default start (-1) would lag the reference by one step.

Caveat: DeepSpeed's config optimizer gets one parameter group, so weight decay also applies to biases and
LayerNorm weights (the reference excludes them). `optimizer_in_ds_config: false` leaves optimizer and scheduler to
`configure_optimizers` (pipeline/core/optim.py: no-decay groups, any schedule).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy, DeepSpeedStrategy

from pipeline.core.cpu_deepspeed import CPUDeepSpeedStrategy

STRATEGY_NAMES = ("auto", "ddp", "deepspeed")

# Keys each kind of strategy file may hold; anything else is a typo and is refused.
_STRATEGY_KEYS = {
    "auto": {"name"},
    "ddp": {"name", "find_unused_parameters", "gradient_as_bucket_view", "static_graph", "process_group_backend"},
    "deepspeed": {"name", "zero_optimization", "zero_allow_untested_optimizer", "optimizer_in_ds_config",
                  "loss_scaling", "steps_per_print", "wall_clock_breakdown"},
}
_LOSS_SCALING_KEYS = {"initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale"}

# Trainer precision -> (bf16 enabled, fp16 enabled)
_PRECISIONS = {
    "bf16-mixed": (True, False), "bf16-true": (True, False), "bf16": (True, False),
    "16-mixed": (False, True), "16-true": (False, True), "16": (False, True),
    "32-true": (False, False), "32": (False, False),
}

# Optimizer config name -> DeepSpeed optimizer type (DeepSpeed matches types case-insensitively)
_DS_OPTIMIZERS = {"adamw": "AdamW", "lamb": "Lamb", "fused_lamb": "Lamb"}


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
    """`bf16` and `fp16` sections for a Trainer precision: bf16-mixed -> bf16, 16-mixed -> fp16 with dynamic loss
    scaling (loss_scale 0), 32 -> neither. Both keys are always present, so Lightning adds nothing of its own."""
    key = str(precision)
    if key not in _PRECISIONS:
        raise ValueError(f"precision {precision!r} is not supported with DeepSpeed; use one of {sorted(_PRECISIONS)}")
    bf16, fp16 = _PRECISIONS[key]
    fp16_section: dict[str, Any] = {"enabled": False}
    if fp16:
        scaling = dict(loss_scaling or {})
        unknown = set(scaling) - _LOSS_SCALING_KEYS
        missing = _LOSS_SCALING_KEYS - set(scaling)
        if unknown or missing:
            raise ValueError(f"strategy.loss_scaling needs exactly {sorted(_LOSS_SCALING_KEYS)} "
                             f"(missing {sorted(missing)}, unknown {sorted(unknown)})")
        fp16_section = {"enabled": True, "loss_scale": 0, **{k: scaling[k] for k in sorted(_LOSS_SCALING_KEYS)}}
    return {"bf16": {"enabled": bf16}, "fp16": fp16_section}


def optimizer_section(optimizer_cfg: Any, *, accelerator: str = "cuda", offload_optimizer: bool = False,
                      zero_stage: int = 0) -> dict[str, Any]:
    """DeepSpeed `optimizer` section from the optimizer config: `name` (adamw | lamb | fused_lamb), `lr`, `betas`,
    `eps`, `weight_decay`; other keys are ignored.

    On CUDA, type AdamW makes DeepSpeed build FusedAdam (adam_w_mode) and type Lamb FusedLamb; with the optimizer
    state offloaded it builds DeepSpeedCPUAdam. On the CPU accelerator (tests, laptops) AdamW gets `torch_adam: true`:
    torch.optim.AdamW, the same update, without JIT-compiling DeepSpeed's CPU FusedAdam op. LAMB exists in DeepSpeed
    only as the CUDA FusedLamb, and only without ZeRO partitioning (stage 0).
    `lr` is 0.0, the rate of the first step: the scheduler section holds the peak rate (see the module docstring).
    """
    cfg = _plain(optimizer_cfg)
    missing = [k for k in ("name", "lr", "betas", "eps", "weight_decay") if cfg.get(k) is None]
    if missing:
        raise ValueError(f"optimizer config lacks {missing} (needed for the DeepSpeed optimizer section)")
    name = str(cfg["name"]).lower()
    if name not in _DS_OPTIMIZERS:
        raise ValueError(f"optimizer.name must be one of {sorted(_DS_OPTIMIZERS)} with DeepSpeed, got {cfg['name']!r}")
    betas = [float(b) for b in cfg["betas"]]
    if len(betas) != 2:
        raise ValueError(f"optimizer.betas must hold two numbers, got {cfg['betas']!r}")
    params: dict[str, Any] = {"lr": 0.0, "betas": betas, "eps": float(cfg["eps"]),
                              "weight_decay": float(cfg["weight_decay"])}
    if _DS_OPTIMIZERS[name] == "Lamb":
        if zero_stage >= 1:
            raise ValueError(f"LAMB with DeepSpeed ZeRO stage {zero_stage}: ZeRO gives the optimizer flat partitions "
                             "of many tensors, so LAMB's per-tensor trust ratio would be wrong. Use AdamW with ZeRO, "
                             "or LAMB with strategy=ddp or optimizer_in_ds_config=false")
        if accelerator == "cpu":
            raise ValueError("LAMB with DeepSpeed is FusedLamb, which needs CUDA; use optimizer.name=adamw on CPU")
    elif accelerator == "cpu" and not offload_optimizer:
        params["torch_adam"] = True
    return {"type": _DS_OPTIMIZERS[name], "params": params}


def scheduler_section(optimizer_cfg: Any) -> dict[str, Any]:
    """DeepSpeed `scheduler` section: WarmupDecayLR, linear warm-up from 0 to `lr` over `warmup_steps`, then linear
    decay to 0 at `total_steps` (optimizer steps, e.g. trainer.max_steps): BERT's schedule. Starting at iteration 0
    (with the optimizer at lr 0.0), optimizer step k runs at lr * k / warmup_steps during the warm-up."""
    cfg = _plain(optimizer_cfg)
    missing = [k for k in ("lr", "warmup_steps", "total_steps") if cfg.get(k) is None]
    if missing:
        raise ValueError(f"optimizer config lacks {missing} (needed for DeepSpeed's WarmupDecayLR)")
    warmup, total = int(cfg["warmup_steps"]), int(cfg["total_steps"])
    if not 2 <= warmup < total:
        raise ValueError(f"DeepSpeed's WarmupDecayLR needs 2 <= warmup_steps < total_steps (it rejects 0 and runs 1 "
                         f"as 2), got warmup_steps={warmup}, total_steps={total}; for other schedules set "
                         "strategy.optimizer_in_ds_config=false")
    return {"type": "WarmupDecayLR",
            "params": {"warmup_min_lr": 0.0, "warmup_max_lr": float(cfg["lr"]), "warmup_num_steps": warmup,
                       "total_num_steps": total, "warmup_type": "linear", "last_batch_iteration": 0}}


def deepspeed_config(strategy_cfg: Any, *, precision: str | int, gradient_clip_val: float | None,
                     micro_batch_size: int, accumulate_grad_batches: int, optimizer_cfg: Any,
                     accelerator: str = "cuda") -> dict[str, Any]:
    """The full DeepSpeed config dict for a `deepspeed` strategy file. Pure: no DeepSpeed import, no environment."""
    cfg = _checked_strategy_cfg(strategy_cfg)
    if cfg["name"] != "deepspeed":
        raise ValueError(f"deepspeed_config needs a deepspeed strategy, got name={cfg['name']!r}")
    accelerator = resolve_accelerator(accelerator)   # pure unless given "auto"
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
        **precision_sections(precision, cfg.get("loss_scaling")),
    }
    if cfg.get("optimizer_in_ds_config", True):
        offload = (zero.get("offload_optimizer") or {}).get("device", "none") not in ("none", None)
        config["optimizer"] = optimizer_section(optimizer_cfg, accelerator=accelerator, offload_optimizer=offload,
                                                zero_stage=int(zero["stage"]))
        config["scheduler"] = scheduler_section(optimizer_cfg)
    return config


def check_strategy_config(strategy_cfg: Any, *, precision: str | int, gradient_clip_val: float | None,
                          micro_batch_size: int, accumulate_grad_batches: int, optimizer_cfg: Any,
                          accelerator: str = "auto") -> None:
    """Refuse a strategy that build_strategy would refuse with these settings, without building it (no process
    group, no device): its keys, and for DeepSpeed the whole config (precision, ZeRO section, optimizer)."""
    cfg = _checked_strategy_cfg(strategy_cfg)
    if cfg["name"] == "deepspeed":
        deepspeed_config(cfg, precision=precision, gradient_clip_val=gradient_clip_val,
                         micro_batch_size=micro_batch_size, accumulate_grad_batches=accumulate_grad_batches,
                         optimizer_cfg=optimizer_cfg, accelerator=accelerator)


def build_strategy(strategy_cfg: Any, *, precision: str | int, gradient_clip_val: float | None,
                   micro_batch_size: int, accumulate_grad_batches: int, optimizer_cfg: Any,
                   accelerator: str = "auto") -> str | pl.strategies.Strategy:
    """The Lightning strategy for a `conf/training/strategy/*.yaml` config. Pass the same precision, gradient_clip_val and
    accumulate_grad_batches to the Trainer: Lightning sets `gradient_accumulation_steps` in the DeepSpeed config
    itself (from Trainer(accumulate_grad_batches)) and refuses a config that already has it, so it is left out here.
    """
    cfg = _checked_strategy_cfg(strategy_cfg)
    device = resolve_accelerator(accelerator)
    if cfg["name"] == "auto":
        return "auto"
    if cfg["name"] == "ddp":
        return DDPStrategy(
            process_group_backend=cfg.get("process_group_backend") or ("nccl" if device == "cuda" else "gloo"),
            find_unused_parameters=bool(cfg.get("find_unused_parameters", False)),
            gradient_as_bucket_view=bool(cfg.get("gradient_as_bucket_view", True)),
            static_graph=bool(cfg.get("static_graph", False)),
        )
    config = deepspeed_config(cfg, precision=precision, gradient_clip_val=gradient_clip_val,
                              micro_batch_size=micro_batch_size, accumulate_grad_batches=accumulate_grad_batches,
                              optimizer_cfg=optimizer_cfg, accelerator=device)
    del config["gradient_accumulation_steps"]
    if device == "cpu":
        # DeepSpeed picks its accelerator once, at import; without CUDA it falls back to CPU anyway.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        return CPUDeepSpeedStrategy(config=config, process_group_backend="gloo")
    return DeepSpeedStrategy(config=config, process_group_backend="nccl")
