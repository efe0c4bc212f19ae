"""MFU under data.unpad (issue 48, item 7): the encoder's dense layers compute on the real tokens only, so the model
FLOPs of an unpadded micro-batch leave out the padding's dense FLOPs (the attention scores stay on the padded rows).
Before, the throughput callback counted B x T tokens through every layer: +6% at seq 128, +15% at 512."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from model import BertConfig, ModernBertConfig, batch_flops, flops_per_token
from model.flops import dense_flops_per_token
from pipeline.core.speed.throughput import ThroughputMonitor


def test_an_unpadded_batch_counts_the_dense_layers_at_its_real_tokens():
    config = BertConfig.from_preset("large")
    B, T, P, N = 64, 128, 20, 7700          # 6% of the 8,192 positions are padding
    padded = flops_per_token(config, T, P) * B * T
    assert batch_flops(config, B, T, P) == padded
    assert batch_flops(config, B, T, P, computed_tokens=N) == pytest.approx(
        padded - 6 * 24 * (4 * 1024**2 + 2 * 1024 * 4096) * (B * T - N), rel=1e-12)
    modern = ModernBertConfig.from_preset("modernbert_base")
    assert dense_flops_per_token(modern) == 6 * 22 * (4 * 768**2 + 3 * 768 * 1152)


def test_the_throughput_callback_counts_an_unpadded_micro_batch_at_its_real_tokens():
    """The callback's FLOPs for one micro-batch (not a log step: counted, not logged), from shapes only."""
    config = BertConfig.from_preset("tiny")
    B, T, P = 4, 16, 3
    lengths = [16, 10, 7, 5]
    mask = torch.tensor([[1] * n + [0] * (T - n) for n in lengths])
    batch = {"input_ids": torch.ones(B, T, dtype=torch.long), "attention_mask": mask,
             "masked_positions": torch.zeros(B, P, dtype=torch.long),
             "token_index": mask.flatten().nonzero().squeeze(1)}
    callback = ThroughputMonitor(log_every_n_steps=10)
    trainer = SimpleNamespace(global_step=0)
    callback._last_step = 0
    module = SimpleNamespace(model=SimpleNamespace(config=config), device=torch.device("cpu"))
    callback.on_train_batch_end(trainer, module, None, batch, 0)
    assert callback._shape_counts[2] == pytest.approx(batch_flops(config, B, T, P, computed_tokens=sum(lengths)))
    assert callback._shape_counts[2] < flops_per_token(config, T, P) * B * T
