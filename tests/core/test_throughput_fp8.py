"""The throughput callback on an FP8 run (issue 48, item 5): MFU against the FP8 peak, the precision the encoder's
matmuls run in, and the bf16-equivalent (the same FLOPs against the bf16 peak) beside it; a bf16 run logs one MFU."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from model import BertConfig, flops_per_token
from model.flops import FP8_OVER_BF16
from pipeline.core.speed.throughput import ThroughputMonitor


def one_window(fp8: bool) -> dict[str, float]:
    """One log step of 2 sequences of 16 tokens, 4 predictions each, after a fixed elapsed time."""
    logged = {}
    config = BertConfig.from_preset("tiny")
    module = SimpleNamespace(device=torch.device("cpu"), model=SimpleNamespace(config=config),
                             log_dict=lambda metrics, **_: logged.update(metrics))
    trainer = SimpleNamespace(global_step=0, world_size=1,
                              strategy=SimpleNamespace(reduce=lambda tensor, reduce_op: tensor))
    monitor = ThroughputMonitor(log_every_n_steps=1, peak_flops=1e12, fp8=fp8)
    monitor.on_train_start(trainer, module)
    trainer.global_step = 1
    batch = {"input_ids": torch.ones(2, 16, dtype=torch.long), "masked_positions": torch.zeros(2, 4)}
    monitor._window_start -= 1.0   # the window took (about) a second
    monitor.on_train_batch_end(trainer, module, None, batch, 0)
    logged["expected_bf16"] = flops_per_token(config, 16, 4) * 32 / 1e12   # per second over 1 s, against 1e12
    return logged


def test_an_fp8_run_reports_mfu_against_the_fp8_peak_and_its_bf16_equivalent_beside_it():
    fp8 = one_window(fp8=True)
    assert fp8["perf/mfu_bf16"] == pytest.approx(fp8["expected_bf16"], rel=0.05)
    assert fp8["perf/mfu"] == pytest.approx(fp8["perf/mfu_bf16"] / FP8_OVER_BF16) and FP8_OVER_BF16 == 2.0


def test_a_bf16_run_reports_one_mfu_against_the_bf16_peak():
    bf16 = one_window(fp8=False)
    assert "perf/mfu_bf16" not in bf16
    assert bf16["perf/mfu"] == pytest.approx(bf16["expected_bf16"], rel=0.05)
