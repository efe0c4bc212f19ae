"""Optimizers and learning-rate schedules for pre-training: what `optimizer` and `scheduler` configs build.

Parameter groups follow google-research/bert (optimization.py's _do_use_weight_decay): weight decay on every
weight matrix and embedding, none on biases and LayerNorm parameters (the embedding LayerNorm included).

Optimizers (`optimizer.name`):
- adamw: torch.optim.AdamW (decoupled weight decay), the BERT paper's optimizer.
- lamb: pytorch_optimizer.Lamb (https://github.com/kozistr/pytorch_optimizer; pure Python on torch, CPU and GPU).
  timm's Lamb, a port of apex's, imports torchvision when timm is imported; torch-optimizer is unmaintained since
  2021. pytorch_optimizer.Lamb is set up as NVIDIA's BERT recipe uses apex FusedLAMB: weight decay added to the
  update inside the trust ratio (weight_decouple=False), parameters without weight decay take a plain Adam step
  (adapt_no_decay=False, apex's use_nvlamb=False), and the global gradient-norm clipping to 1.0 is Lightning's
  gradient_clip_val. Unlike apex, no bias correction (adam_debias=True: the LAMB paper's v3 form; the library's
  default divides the step, after the trust ratio, by 1 - beta1^t): the trust ratio makes an adapted tensor's step
  lr * ||w|| either way, and in the first few thousand steps the weight-decay term weighs less against the Adam
  term than in apex (by sqrt(1 - beta2^t) / (1 - beta1^t): 0.32 at step 1, 0.8 at step 1,000).
- fused_lamb: refused (check_optimizer_config). DeepSpeed's FusedLamb (deepspeed.ops.lamb) is another algorithm than
  the lamb above, NVIDIA's recipe: its CUDA kernel (fused_lamb_cuda_kernel.cu) applies the trust ratio to every
  tensor, biases and LayerNorm included, clamps it to [min_coeff, max_coeff] = [0.01, 10] and bias-corrects the
  step, and none of this can be switched off; it also JIT-compiles that kernel with nvcc at its first use. A run
  configured with it would train another recipe than the one measured and reported for lamb. lamb is the one LAMB,
  on every device.
- stable_adamw: pytorch_optimizer.StableAdamW (Wortsman et al. 2023, "Stable and low-precision training for
  large-scale vision-language models"), ModernBERT's optimizer: AdamW whose step on each tensor is divided by
  max(1, RMS(g^2 / v)), Adafactor's update clipping. With decouple_lr (default, ModernBERT's decoupled_stableadamw:
  optimi's StableAdamW(decouple_lr=True)) the weight decay does not scale with the size of the rate: each step
  multiplies the weights by 1 - weight_decay * lr_t / lr (lr_t the scheduled rate, lr the peak; both divided by the
  same clipping), which the library's lr-scaled decay gives with weight_decay / lr. Under ZeRO it is refused
  (pipeline/pretraining/checks.py): ZeRO steps flat partitions of many tensors, so the clipping's per-tensor RMS
  would be over arbitrary slices.
Under DeepSpeed ZeRO-Offload (the optimizer step on the CPU) AdamW is deepspeed.ops.adam.DeepSpeedCPUAdam, the same
update over the same groups: DeepSpeed takes no other optimizer there.

Schedules: linear_warmup, a linear warmup from 0 to the peak, then (remaining / decay steps) ** power down to 0 at
total_steps (power 1: linear, as BERT; 0.5: NVIDIA's shape); warmup_stable_decay
(pipeline/core/optim/warmup_stable_decay.py), the peak held after the warmup and a decay over the last decay_steps,
which can run as its own phase. Either is a LambdaLR stepped once per optimizer step (WarmupDecaySchedule), whose
checkpointed state is its position only: a resume runs the schedule and the optimizer's rates that the config gives,
from the checkpoint's step (torch's LambdaLR would restore a callable's fields and the old peak rates over them: a run
resumed with more steps and another rate trained its new steps at the old schedule's 0). A resume that changes them is
refused unless accepted (pipeline/core/run/run_record.py).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn as nn

from pipeline.core.optim.warmup_stable_decay import warmup_stable_decay

OPTIMIZERS = ("adamw", "lamb", "stable_adamw")
# Their update is computed per tensor (LAMB's trust ratio, StableAdamW's update clipping): ZeRO would hand them flat
# partitions of many tensors (pipeline/pretraining/checks.py refuses the combination).
PER_TENSOR_OPTIMIZERS = ("lamb", "stable_adamw")
REFUSED_OPTIMIZERS = {
    "fused_lamb": "DeepSpeed's FusedLamb is not this pipeline's LAMB (optimizer=lamb, NVIDIA's BERT recipe): its "
                  "kernel applies the trust ratio to biases and LayerNorm too, clamps it to [0.01, 10] and "
                  "bias-corrects the step, none of which can be switched off, and it compiles with nvcc at its first "
                  "step. Use optimizer=lamb (the same update on the CPU and on GPUs)",
}
SCHEDULERS = ("linear_warmup", "warmup_stable_decay")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """[decayed weights, biases and LayerNorm parameters]; each parameter once (tied weights are one Parameter)."""
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            if isinstance(module, (nn.LayerNorm, nn.GroupNorm)) or name == "bias" or param.ndim < 2:
                no_decay.append(param)
            else:
                decay.append(param)
    groups = [{"params": decay, "weight_decay": weight_decay, "name": "decay"}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "name": "no_decay"})
    return groups


def clips_under_mixed_precision(trainer: Any) -> bool:
    """Whether Lightning clips the gradients of a GradScaler (trainer.precision=16-mixed, outside DeepSpeed, with
    gradient_clip_val): it then refuses any optimizer that unscales gradients in its own step ("does not allow for
    gradient clipping because it performs unscaling of gradients internally"), which torch's fused AdamW declares, at
    the first step. Under bf16-mixed there is no scaler, and the modules clip themselves
    (pipeline/core/speed/clipping.py), so fused AdamW trains there."""
    from pytorch_lightning.plugins.precision import MixedPrecision

    return (isinstance(trainer.precision_plugin, MixedPrecision) and trainer.precision_plugin.scaler is not None
            and bool(trainer.gradient_clip_val))


def check_optimizer_config(cfg: Mapping[str, Any]) -> None:
    """Refuse an optimizer this pipeline does not train with, saying why (before anything runs)."""
    name = cfg.get("name")
    if name in REFUSED_OPTIMIZERS:
        raise ValueError(f"optimizer={name}: {REFUSED_OPTIMIZERS[name]}")
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")


def build_optimizer(model: nn.Module, cfg: Mapping[str, Any], offload: bool = False,
                    lightning_clips_amp: bool = False) -> torch.optim.Optimizer:
    """offload: the strategy steps the optimizer on the CPU (DeepSpeed ZeRO-Offload). lightning_clips_amp:
    clips_under_mixed_precision(trainer), where torch's fused AdamW cannot be used."""
    check_optimizer_config(cfg)
    name = cfg["name"]
    lr, weight_decay = float(cfg["lr"]), float(cfg.get("weight_decay", 0.0))
    betas = tuple(float(b) for b in cfg.get("betas", (0.9, 0.999)))
    eps = float(cfg.get("eps", 1e-6))
    groups = param_groups(model, weight_decay)
    if offload:
        if name != "adamw":
            raise ValueError(f"optimizer={name} with ZeRO-Offload: DeepSpeed steps an offloaded optimizer with "
                             "DeepSpeedCPUAdam only; use optimizer=adamw, or a strategy without offload")
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        return DeepSpeedCPUAdam(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adamw_mode=True)
    if name == "adamw":
        fused = cfg.get("fused")
        # torch's fused kernel exists for CUDA and (since torch 2.4) the CPU; on the CPU the per-tensor loop it
        # replaces costs more than the forward and backward of a short fine-tuning batch (BERT-mini, 32 sentences
        # of SST-2: 164 ms against 12 ms a step, bench_finetune.py's setting).
        on_fused_device = all(p.device.type in ("cuda", "cpu") for group in groups for p in group["params"])
        if fused and lightning_clips_amp:
            raise ValueError("optimizer.fused=true cannot train with trainer.precision=16-mixed and gradient clipping: "
                             "Lightning refuses to clip the gradients of an optimizer that unscales them itself; "
                             "set optimizer.fused=null (the per-tensor kernels there) or trainer.gradient_clip_val=0")
        fused = (on_fused_device and not lightning_clips_amp) if fused is None else bool(fused)
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused or None)
    if name == "lamb":
        try:
            from pytorch_optimizer import Lamb
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise ImportError("optimizer=lamb needs the pytorch-optimizer package: "
                              "pip install pytorch-optimizer (pure Python; torch and numpy only)") from error
        if not cfg.get("adapt_no_decay", False):
            for group in groups:
                if group["weight_decay"] == 0.0:
                    group["adam"] = True  # trust ratio 1: apex FusedLAMB's use_nvlamb=False
        optimizer = Lamb(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, weight_decouple=False,
                         grad_averaging=True, max_grad_norm=0.0, pre_norm=False, adam_debias=True)
        optimizer.clamp = float(cfg.get("trust_clamp", 10.0))
        return optimizer
    if name == "stable_adamw":
        return _stable_adamw(model, cfg, lr, betas, eps, weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")


def _stable_adamw(model: nn.Module, cfg: Mapping[str, Any], lr: float, betas: tuple[float, ...], eps: float,
                  weight_decay: float) -> torch.optim.Optimizer:
    from pytorch_optimizer import StableAdamW

    if cfg.get("decouple_lr", True):
        # the library scales the decay by the (clipped) scheduled rate: / lr leaves lr_t / lr, optimi's decouple_lr
        weight_decay = weight_decay / lr
    # kahan_sum (the library's default) acts on bf16/fp16 parameters only (trainer.precision=bf16-true); fp32
    # parameters, mixed precision's master weights included, step without it.
    return StableAdamW(param_groups(model, weight_decay), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                       weight_decouple=True)


def warmup_steps_of(cfg: Mapping[str, Any], total_steps: int) -> int:
    steps, fraction = cfg.get("warmup_steps"), cfg.get("warmup_fraction")
    if steps is not None and fraction is not None:
        raise ValueError("give scheduler.warmup_steps or scheduler.warmup_fraction, not both")
    if fraction is not None:
        if not 0.0 <= float(fraction) < 1.0:
            raise ValueError(f"scheduler.warmup_fraction must be in [0, 1), got {fraction}")
        return int(round(float(fraction) * total_steps))
    steps = int(steps or 0)
    if not 0 <= steps < total_steps:
        raise ValueError(f"scheduler.warmup_steps ({steps}) must be in [0, total steps = {total_steps})")
    return steps


def lr_factor(step: int, warmup_steps: int, total_steps: int, power: float = 1.0) -> float:
    """Multiplier of the peak rate for the optimizer step `step` (0-based: the factor the step is taken with).

    Warmup: step / warmup (google-research/bert and transformers: the first step is taken at rate 0); decay:
    ((total - step) / (total - warmup)) ** power, continuous at the end of the warmup and 0 at step == total.
    """
    if step < warmup_steps:
        return step / warmup_steps
    remaining = max(0, total_steps - step)
    return (remaining / max(1, total_steps - warmup_steps)) ** power


def schedule_factor(cfg: Mapping[str, Any], max_steps: int) -> Callable[[int], float]:
    """The factor of the peak rate at each optimizer step that a `scheduler` config gives (its total_steps, else
    max_steps); a bad config is refused here, which preflight calls before anything runs."""
    name = cfg.get("name", "linear_warmup")
    if name not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {name!r}; known: {', '.join(SCHEDULERS)}")
    total = int(cfg.get("total_steps") or max_steps)
    if total <= 0:
        raise ValueError(f"the schedule needs a positive number of steps (trainer.max_steps), got {total}")
    warmup = warmup_steps_of(cfg, total)
    if name == "warmup_stable_decay":
        return warmup_stable_decay(cfg, warmup, total)
    power = float(cfg.get("power", 1.0))
    if power < 0 or math.isnan(power):
        raise ValueError(f"scheduler.power must be >= 0, got {power}")
    return _Factor(warmup, total, power)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: Mapping[str, Any],
                    max_steps: int) -> WarmupDecaySchedule:
    return WarmupDecaySchedule(optimizer, schedule_factor(cfg, max_steps))


class WarmupDecaySchedule(torch.optim.lr_scheduler.LambdaLR):
    """A LambdaLR whose state is its position (optimizer steps taken), nothing of the config.

    Loading a state, an older checkpoint's too (which holds the factor's fields and the peak rates), takes its
    position only, and puts back what the config gave each parameter group (its rate, the schedule's peak, betas,
    eps, weight decay), over what the optimizer's restore brought back: Lightning restores the optimizer, then the
    schedule. What an optimizer counts in a group (LAMB's and StableAdamW's `step`) is not config and stays restored.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, factor: Callable[[int], float]):
        self._configured = [{key: value for key, value in group.items() if key != "params"}
                            for group in optimizer.param_groups]
        super().__init__(optimizer, factor)

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.last_epoch, "_step_count": self._step_count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_epoch = int(state_dict["last_epoch"])
        self._step_count = int(state_dict.get("_step_count", self.last_epoch + 1))
        for group, configured in zip(self.optimizer.param_groups, self._configured, strict=True):
            group.update(configured)
            group["initial_lr"] = configured["lr"]
        self.base_lrs = [group["initial_lr"] for group in self.optimizer.param_groups]
        for group, factor, base_lr in zip(self.optimizer.param_groups, self.lr_lambdas, self.base_lrs):
            group["lr"] = base_lr * factor(self.last_epoch)     # as LambdaLR.get_lr computes it at a step
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


class _Factor:
    """The schedule's factor as a picklable object (a closure would not pickle); its fields are the config's, never a
    checkpoint's (WarmupDecaySchedule saves its position only)."""

    def __init__(self, warmup_steps: int, total_steps: int, power: float):
        self.warmup_steps, self.total_steps, self.power = warmup_steps, total_steps, power

    def __call__(self, step: int) -> float:
        return lr_factor(step, self.warmup_steps, self.total_steps, self.power)
