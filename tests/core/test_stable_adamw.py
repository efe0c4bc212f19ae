"""optimizer=stable_adamw: pytorch_optimizer's StableAdamW over the pipeline's parameter groups, with ModernBERT's
settings and its fully decoupled weight decay; its first step against the update written out by hand; a tiny BERT's
loss falls under it; refused under ZeRO, saying why, and accepted under DDP and DeepSpeed without ZeRO."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from pipeline.core.app import compose
from pipeline.core.optim.optimizers import build_optimizer, param_groups
from pipeline.pretraining.checks import check_strategy_and_optimizer

StableAdamW = pytest.importorskip("pytorch_optimizer").StableAdamW


def tiny_bert():
    from model import BertConfig, BertForPreTraining
    torch.manual_seed(0)
    return BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=64, max_position_embeddings=32))


def configured(*overrides: str) -> dict:
    return OmegaConf.to_container(compose("train", ["optimizer=stable_adamw", *overrides]).optimizer, resolve=True)


def test_it_is_the_librarys_stable_adamw_over_our_groups_with_modernberts_settings():
    cfg = configured("optimizer.lr=8e-4")
    assert (cfg["betas"], cfg["eps"], cfg["weight_decay"], cfg["decouple_lr"]) == ([0.9, 0.98], 1e-6, 1e-5, True)
    assert configured()["lr"] == compose("train").model.pretraining_lr            # the preset's, as adamw
    model = tiny_bert()
    optimizer = build_optimizer(model, cfg)
    assert type(optimizer) is StableAdamW
    expected = param_groups(model, 0.0)
    decay, no_decay = optimizer.param_groups
    assert all(p is q for p, q in zip(decay["params"], expected[0]["params"], strict=True))
    assert all(p is q for p, q in zip(no_decay["params"], expected[1]["params"], strict=True))
    # the library scales decay by the clipped rate: 1e-5 / 8e-4 leaves ModernBERT's 1e-5 x lr_t / lr
    assert decay["weight_decay"] == pytest.approx(1e-5 / 8e-4, rel=1e-12) and no_decay["weight_decay"] == 0.0
    assert all((g["lr"], g["betas"], g["eps"], g["weight_decouple"]) == (8e-4, (0.9, 0.98), 1e-6, True)
               for g in optimizer.param_groups)
    assert build_optimizer(model, {**cfg, "decouple_lr": False}).param_groups[0]["weight_decay"] == 1e-5


def test_the_first_step_is_the_update_written_by_hand():
    """Step 1: m = g, v = g^2 (debiased), RMS(g^2 / v) = 1 so no clipping; the weights decay by exactly
    weight_decay at the peak rate (decouple_lr), then move by lr * g / (|g| + eps)."""
    lr, wd, eps = 0.01, 0.1, 1e-6
    layer = torch.nn.Linear(3, 2)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    optimizer = build_optimizer(layer, {"name": "stable_adamw", "lr": lr, "weight_decay": wd, "eps": eps,
                                        "betas": [0.9, 0.98]})
    layer.weight.grad, layer.bias.grad = torch.randn_like(weight), torch.randn_like(bias)
    grad_w, grad_b = layer.weight.grad.clone(), layer.bias.grad.clone()
    optimizer.step()
    torch.testing.assert_close(layer.weight.detach(), weight * (1 - wd) - lr * grad_w / (grad_w.abs() + eps))
    torch.testing.assert_close(layer.bias.detach(), bias - lr * grad_b / (grad_b.abs() + eps))   # no decay


def test_a_gradient_spike_is_clipped_per_tensor():
    """Update clipping: without weight decay each step is torch's Adam step divided by max(1, RMS(g^2 / v)) of its
    tensor; after unit gradients a 100x gradient makes that RMS about 4."""
    lr, betas = 0.01, (0.9, 0.98)
    stable, plain = torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)
    plain.load_state_dict(stable.state_dict())
    optimizer = build_optimizer(stable, {"name": "stable_adamw", "lr": lr, "weight_decay": 0.0, "betas": betas})
    adam = torch.optim.Adam(plain.parameters(), lr=lr, betas=betas, eps=1e-6)
    for step in range(21):
        before_stable, before_plain = stable.weight.detach().clone(), plain.weight.detach().clone()
        grad = torch.full_like(stable.weight, 100.0 if step == 20 else 1.0)
        stable.weight.grad, plain.weight.grad = grad.clone(), grad.clone()
        optimizer.step()
        adam.step()
    v_hat = adam.state[plain.weight]["exp_avg_sq"] / (1 - betas[1] ** 21)
    rms = (grad.pow(2) / v_hat).mean().sqrt().item()
    assert rms > 4
    torch.testing.assert_close((stable.weight.detach() - before_stable) * rms, plain.weight.detach() - before_plain)


def test_a_tiny_berts_loss_falls():
    model = tiny_bert()
    optimizer = build_optimizer(model, configured("optimizer.lr=3e-3"))
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 64, (8, 16), generator=generator)
    batch = dict(masked_positions=torch.tensor([[1, 2, 3]] * 8), masked_lm_labels=ids[:, 1:4].clone(),
                 next_sentence_labels=torch.zeros(8, dtype=torch.long))
    masked = ids.clone()
    masked[:, 1:4] = 4
    model.eval()    # no dropout: the loss of one batch, fitted
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = model(masked, **batch).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("strategy", ["deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3"])
def test_zero_is_refused_saying_why(strategy):
    with pytest.raises(ValueError, match=r"optimizer=stable_adamw with DeepSpeed ZeRO stage \d: .*update clipping"):
        check_strategy_and_optimizer(compose("train", [f"strategy={strategy}", "optimizer=stable_adamw"]))


def test_ddp_and_deepspeed_without_zero_are_accepted():
    check_strategy_and_optimizer(compose("train", ["strategy=ddp", "optimizer=stable_adamw"]))
    check_strategy_and_optimizer(compose("train", ["strategy=deepspeed_stage_1", "optimizer=stable_adamw",
                                                   "strategy.zero_optimization.stage=0"]))


def test_offload_is_refused():
    with pytest.raises(ValueError, match="DeepSpeedCPUAdam only"):
        build_optimizer(torch.nn.Linear(2, 2), {"name": "stable_adamw", "lr": 1e-3}, offload=True)
