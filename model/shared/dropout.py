"""Dropout as both encoders draw it."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout(x, p, training): each element kept with probability 1 - p and scaled by 1 / (1 - p).

    On the CPU (fp32) the mask is drawn with torch.rand: F.dropout draws it with bernoulli_, which there is about
    twice as slow (~6 vs ~3 ms per million elements; its masks were ~10% of a CPU training step of the mini
    model). The distribution is the same; the draws, hence the masks for a given seed, are not.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return F.dropout(x, p, training=True)  # CUDA's fused kernel; low-precision uniforms would skew p
    mask = torch.rand_like(x).ge_(p).mul_(1.0 / (1.0 - p))  # 1 / (1 - p) where kept, 0 where dropped
    return x * mask
