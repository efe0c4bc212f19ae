"""scheduler=warmup_stable_decay: its factor at the steps that define it, for each decay shape; its settings refused
before anything runs; a checkpoint's position rebuilt into the resumed config's schedule; and the decay run as its own
phase giving the factors of an uninterrupted run (no training: tests/pretraining/test_train_wsd_resume.py trains)."""
from __future__ import annotations

import math

import pytest
import torch

from pipeline.core.app import compose
from pipeline.core.optim.optimizers import build_optimizer, build_scheduler, schedule_factor
from pipeline.core.optim.warmup_stable_decay import WarmupStableDecay
from pipeline.pretraining.checks import preflight

WARMUP, TOTAL, DECAY = 4, 20, 8            # stable at steps 4..11, decay over 12..19, the floor at 20


@pytest.mark.parametrize("shape,halfway", [("1-sqrt", 1 - math.sqrt(0.5)), ("linear", 0.5), ("cosine", 0.5)])
@pytest.mark.parametrize("floor", [0.0, 0.1])
def test_the_factor_at_each_phase_boundary(shape, halfway, floor):
    factor = WarmupStableDecay(WARMUP, TOTAL, DECAY, shape=shape, min_lr_ratio=floor)
    assert [factor(s) for s in range(WARMUP + 1)] == [0.0, 0.25, 0.5, 0.75, 1.0]    # the warmup, its end at the peak
    assert all(factor(s) == 1.0 for s in range(WARMUP, TOTAL - DECAY + 1))        # stable, and the decay's first step
    assert factor(TOTAL - DECAY // 2) == pytest.approx(floor + (1 - floor) * halfway)
    assert factor(TOTAL) == pytest.approx(floor, abs=1e-15) and factor(TOTAL + 5) == factor(TOTAL)   # then the floor
    decay = [factor(s) for s in range(TOTAL - DECAY, TOTAL + 1)]
    assert all(a > b for a, b in zip(decay, decay[1:]))
    assert factor.decay_start == TOTAL - DECAY


def test_the_shapes_are_the_published_formulas():
    one_minus_sqrt, cosine = (WarmupStableDecay(0, 10, 10, shape=s) for s in ("1-sqrt", "cosine"))
    assert one_minus_sqrt(1) == pytest.approx(1 - math.sqrt(0.1))                   # Hägele et al. 2024, eq. (1)
    assert cosine(3) == pytest.approx((1 + math.cos(math.pi * 0.3)) / 2)


def test_no_decay_holds_the_peak_to_the_end_and_past_it():
    factor = schedule_factor({"name": "warmup_stable_decay", "warmup_steps": 2, "decay_steps": 0}, 10)
    assert [factor(s) for s in (2, 9, 10, 11)] == [1.0, 1.0, 1.0, 1.0]


def test_decay_fraction_is_a_share_of_the_schedule():
    factor = schedule_factor({"name": "warmup_stable_decay", "warmup_steps": 1, "decay_fraction": 0.25,
                              "total_steps": 40}, 999)
    assert (factor.total_steps, factor.decay_steps, factor.decay_start) == (40, 10, 30)


@pytest.mark.parametrize("settings,why", [
    ({"decay_steps": 2, "decay_fraction": 0.1}, "not both"),
    ({"decay_steps": 11}, r"decay_steps \(11\) must be in \[0, total steps = 10\]"),
    ({"decay_fraction": 1.5}, "decay_fraction must be in"),
    ({"decay_steps": 9, "warmup_steps": 2}, "overlap"),
    ({"decay_steps": 2, "decay_shape": "exponential"}, "decay_shape='exponential'; known: 1-sqrt, linear, cosine"),
    ({"decay_steps": 2, "min_lr_ratio": 2.0}, "min_lr_ratio must be in"),
])
def test_bad_settings_are_refused_at_preflight(settings, why):
    overrides = ["scheduler=warmup_stable_decay", "trainer.max_steps=10", "scheduler.warmup_steps=1",
                 "scheduler.decay_fraction=null", *(f"scheduler.{k}={'null' if v is None else v}"
                                                    for k, v in settings.items())]
    with pytest.raises(ValueError, match=why):
        preflight(compose("train", overrides))


def test_the_default_config_passes_preflight():
    shape = preflight(compose("train", ["scheduler=warmup_stable_decay", "optimizer=stable_adamw"]))
    factor = schedule_factor(compose("train", ["scheduler=warmup_stable_decay"]).scheduler, shape.schedule_steps)
    assert (factor.warmup_steps, factor.decay_steps, factor.shape, factor.min_lr_ratio) == (30, 60, "1-sqrt", 0.0)


def _trained_schedule(cfg, max_steps, steps):
    """(model, optimizer state, schedule state) after `steps` optimizer steps under (cfg, max_steps)."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = build_optimizer(model, {"name": "stable_adamw", "lr": 1e-3, "weight_decay": 1e-5})
    scheduler = build_scheduler(optimizer, cfg, max_steps)
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
    return model, optimizer.state_dict(), scheduler.state_dict()


STABLE = {"name": "warmup_stable_decay", "warmup_steps": 2, "decay_steps": 0}


@pytest.mark.parametrize("k", [3, 6, 9])
def test_the_decay_as_its_own_phase_has_the_rates_of_an_uninterrupted_run(k):
    """A stable phase (decay_steps=0, any length) resumed at step k with max_steps=k+D, decay_steps=D: the restored
    schedule's rate at every step equals an uninterrupted k+D-step run's with decay_steps=D, to the bit."""
    d = 5
    decay_phase = {**STABLE, "decay_steps": d}
    model, optimizer_state, schedule_state = _trained_schedule(STABLE, 1000, k)
    optimizer = build_optimizer(model, {"name": "stable_adamw", "lr": 1e-3, "weight_decay": 1e-5})
    scheduler = build_scheduler(optimizer, decay_phase, k + d)
    optimizer.load_state_dict(optimizer_state)           # Lightning: the optimizer first, then the schedule
    scheduler.load_state_dict(schedule_state)
    uninterrupted = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    straight = build_scheduler(uninterrupted, decay_phase, k + d)
    rates = {}
    for step in range(k + d):
        rates[step] = uninterrupted.param_groups[0]["lr"]
        uninterrupted.step()
        straight.step()
    resumed = []
    for _ in range(d):
        resumed.append([group["lr"] for group in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    assert resumed == [[rates[step]] * 2 for step in range(k, k + d)]
    assert resumed[0] == [1e-3, 1e-3] and rates[k + d - 1] < rates[k]            # from the peak, down the decay
    assert [g["step"] for g in optimizer.param_groups] == [k + d] * 2       # StableAdamW's own count: restored


def test_an_accepted_change_of_the_total_moves_the_decay():
    """decay_fraction of a longer schedule: the restored position's factor is the new config's."""
    cfg = {"name": "warmup_stable_decay", "warmup_steps": 2, "decay_fraction": 0.5}
    model, optimizer_state, schedule_state = _trained_schedule(cfg, 10, 6)    # in the decay (5..9)
    optimizer = build_optimizer(model, {"name": "stable_adamw", "lr": 1e-3, "weight_decay": 1e-5})
    scheduler = build_scheduler(optimizer, cfg, 20)                            # its decay now 10..19: stable at 6
    optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(schedule_state)
    assert [g["lr"] for g in optimizer.param_groups] == [1e-3, 1e-3]
