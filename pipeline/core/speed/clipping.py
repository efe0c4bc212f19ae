"""Gradient clipping by the LightningModule itself wherever the gradients it sees are the final ones.

Lightning clips through its precision plugin, and its mixed-precision plugin refuses any optimizer that unscales
gradients in its own step ("does not allow for gradient clipping because it performs unscaling of gradients
internally"), which torch's fused AdamW declares. That refusal guards a GradScaler's scaled gradients (16-mixed):
under bf16-mixed there is no scaler and nothing to unscale, so the modules clip themselves there (and in fp32),
with torch's multi-tensor norm, and torch's fused AdamW trains under bf16-mixed with clipping. 16-mixed keeps
Lightning's path, which unscales before clipping. Under DeepSpeed the engine clips (its `gradient_clipping`) the
gradient partitions it holds; Lightning's DeepSpeed plugin clips nothing, and neither does this.

The norm clip_grad_norm_ returns (of the gradients before clipping) is what the modules log as train/grad_norm.
"""
from __future__ import annotations

from typing import Any

import torch
from pytorch_lightning.strategies import DeepSpeedStrategy


def clips_itself(trainer: Any) -> bool:
    """Whether the module clips (gradient_clip_val set, by norm, no GradScaler, no DeepSpeed)."""
    if not trainer.gradient_clip_val or isinstance(trainer.strategy, DeepSpeedStrategy):
        return False
    if trainer.gradient_clip_algorithm not in (None, "norm"):   # a str enum: equal to its value
        return False
    return getattr(trainer.precision_plugin, "scaler", None) is None


def clip_by_norm(parameters: Any, max_norm: float) -> torch.Tensor:
    """Clip to `max_norm` in place; the total 2-norm before clipping, on the device (no host read)."""
    return torch.nn.utils.clip_grad_norm_(list(parameters), max_norm, foreach=True)


def zero_gradients(parameters: Any, allocate: bool = False) -> None:
    """Every gradient zeroed in place in one multi-tensor call (Optimizer.zero_grad(set_to_none=False) zeroes them
    one kernel at a time unless the optimizer was built with foreach=True: 302 launches for BERT-Large).
    allocate: a trainable parameter without a .grad gets one of zeros first, so that the backward adds into it."""
    parameters = list(parameters)
    if allocate:
        for p in parameters:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
    grads = [p.grad for p in parameters if p.grad is not None]
    if grads:
        torch._foreach_zero_(grads)
