"""Warmup-stable-decay (`scheduler=warmup_stable_decay`): a linear warmup from 0 to the peak, the peak held, then a
decay over the schedule's last `decay_steps` down to a floor (`min_lr_ratio` of the peak, 0 by default).

Decay shapes, of x (the share of the decay done: 0 at its first step, 1 at the schedule's end):
- 1-sqrt: 1 - sqrt(x), Hägele et al. 2024 ("Scaling Laws and Compute-Optimal Training Beyond Fixed Training
  Durations": it matched cosine at 20% of the steps); ModernBERT's decay phase (Warner et al. 2024);
- linear: 1 - x;
- cosine: (1 + cos(pi x)) / 2.

The decay is always the LAST decay_steps of the schedule (which ends at scheduler.total_steps, or trainer.max_steps),
whatever ran before it. That is what lets it run as its own phase: a stable phase trained with decay_steps=0 (the
peak to its end), resumed from its checkpoint at any step k with trainer.max_steps=k+D and scheduler.decay_steps=D,
decays over exactly the steps k..k+D-1 that an uninterrupted run of k+D steps with decay_steps=D decays over. The
checkpoint holds the schedule's position only (pipeline/core/optim/optimizers.py, WarmupDecaySchedule), so the resumed
run's factors are this config's; the resume check names the changed keys until they are accepted
(resume.accept_changes=[trainer.max_steps,scheduler.decay_steps]: pipeline/core/run/run_record.py).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

DECAY_SHAPES = ("1-sqrt", "linear", "cosine")


def decay_steps_of(cfg: Mapping[str, Any], total_steps: int) -> int:
    """scheduler.decay_steps, or scheduler.decay_fraction of the total (one of them; neither: no decay)."""
    steps, fraction = cfg.get("decay_steps"), cfg.get("decay_fraction")
    if steps is not None and fraction is not None:
        raise ValueError("give scheduler.decay_steps or scheduler.decay_fraction, not both")
    if fraction is not None:
        if not 0.0 <= float(fraction) <= 1.0:
            raise ValueError(f"scheduler.decay_fraction must be in [0, 1], got {fraction}")
        return int(round(float(fraction) * total_steps))
    steps = int(steps or 0)
    if not 0 <= steps <= total_steps:
        raise ValueError(f"scheduler.decay_steps ({steps}) must be in [0, total steps = {total_steps}]")
    return steps


class WarmupStableDecay:
    """The factor of the peak rate at optimizer step `step` (0-based: the factor the step is taken with); picklable,
    its fields the config's (the schedule saves its position only)."""

    def __init__(self, warmup_steps: int, total_steps: int, decay_steps: int, shape: str = "1-sqrt",
                 min_lr_ratio: float = 0.0):
        if shape not in DECAY_SHAPES:
            raise ValueError(f"scheduler.decay_shape={shape!r}; known: {', '.join(DECAY_SHAPES)}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"scheduler.min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        if warmup_steps + decay_steps > total_steps:
            raise ValueError(f"the warmup ({warmup_steps} steps) and the decay ({decay_steps}) overlap: they must fit "
                             f"in the schedule's {total_steps} steps (scheduler.total_steps or trainer.max_steps)")
        self.warmup_steps, self.total_steps, self.decay_steps = warmup_steps, total_steps, decay_steps
        self.shape, self.min_lr_ratio = shape, min_lr_ratio

    @property
    def decay_start(self) -> int:
        return self.total_steps - self.decay_steps

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / self.warmup_steps     # as linear_warmup: the first step at rate 0
        if step < self.decay_start or self.decay_steps == 0:
            return 1.0          # no decay: the peak to the end (a stable phase, decayed later as its own phase)
        done = min(1.0, (step - self.decay_start) / self.decay_steps)
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * _decayed(self.shape, done)


def _decayed(shape: str, done: float) -> float:
    if shape == "1-sqrt":
        return 1.0 - math.sqrt(done)
    if shape == "linear":
        return 1.0 - done
    return 0.5 * (1.0 + math.cos(math.pi * done))


def warmup_stable_decay(cfg: Mapping[str, Any], warmup_steps: int, total_steps: int) -> WarmupStableDecay:
    return WarmupStableDecay(warmup_steps, total_steps, decay_steps_of(cfg, total_steps),
                             shape=str(cfg.get("decay_shape", "1-sqrt")),
                             min_lr_ratio=float(cfg.get("min_lr_ratio") or 0.0))
