"""The training configs compose, say what the papers say, and the pieces they configure behave (no training)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from pipeline.core.app import REPO_ROOT, compose
from pipeline.core.app import TRAINING_CONFIGS as CONFIG_DIR
from pipeline.core.devices import batch_split
from pipeline.core.optim.optimizers import build_optimizer, build_scheduler, lr_factor, param_groups
from pipeline.pretraining.checks import check_strategy_and_optimizer, model_config_of

# the GPU recipes (cpu_hour: test_cpu_hour.py)
EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("bert_*.yaml"))
DEBUG_PRESETS = sorted(p.stem for p in (CONFIG_DIR / "debug").glob("*.yaml"))
GROUP_OPTIONS = [(group, p.stem) for group in ("model", "data", "trainer", "optimizer", "scheduler", "logger",
                                               "callbacks", "strategy")
                 for p in sorted((CONFIG_DIR / group).glob("*.yaml"))]


def resolved(cfg, *keys):
    """The given sub-configs resolved (the run directory interpolation only exists inside a Hydra run)."""
    return {key: OmegaConf.to_container(cfg[key], resolve=True) for key in keys}


def test_default_config():
    cfg = compose("train")
    parts = resolved(cfg, "model", "data", "trainer", "optimizer", "scheduler", "logger", "callbacks", "strategy")
    assert parts["model"]["name"] == "tiny"
    assert Path(parts["data"]["path"]) == REPO_ROOT / "outputs" / "shards" / "sample"
    assert parts["trainer"]["accelerator"] == "cpu" and parts["trainer"]["precision"] == "32-true"
    assert parts["strategy"]["name"] == "auto"
    assert parts["optimizer"]["name"] == "adamw" and parts["logger"]["mode"] == "disabled"
    assert cfg.ckpt_path is None and cfg.init_from_checkpoint is None
    assert OmegaConf.select(cfg, "output_dir", throw_on_resolution_failure=False) is None  # Hydra's run dir
    assert model_config_of(cfg).num_layers == 2


@pytest.mark.parametrize("group,option", GROUP_OPTIONS)
def test_every_group_option_composes(group, option):
    cfg = compose("train", [f"{group}={option}"])
    OmegaConf.to_container(cfg[group], resolve=True)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes(name, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    cfg = compose("train", [f"+experiment={name}"])
    parts = resolved(cfg, "model", "data", "trainer", "optimizer", "scheduler", "logger", "callbacks", "strategy")
    config = model_config_of(cfg)
    assert parts["trainer"]["precision"] == "bf16-mixed" and parts["trainer"]["accelerator"] == "gpu"
    assert parts["logger"]["mode"] == "online"
    assert config.hidden_dropout == 0.1 and config.attention_dropout == 0.1
    phase2 = name.endswith("phase2")
    assert parts["data"]["max_seq_length"] == (512 if phase2 else 128)
    assert parts["data"]["max_predictions_per_seq"] == (80 if phase2 else 20)
    assert cfg.require_init_from_checkpoint == phase2 and cfg.init_from_checkpoint is None
    check_strategy_and_optimizer(cfg)   # no refused combination (every shape: tests/pretraining/test_recipes.py)


def test_published_settings():
    base = compose("train", ["+experiment=bert_base"])
    assert (base.model.name, base.data.global_batch_size, base.optimizer.name, base.optimizer.lr) == \
        ("base", 256, "adamw", 1e-4)
    assert (base.scheduler.warmup_steps, base.scheduler.power, base.optimizer.weight_decay) == (10000, 1.0, 0.01)
    assert base.trainer.max_steps == 900_000 and base.scheduler.total_steps == 1_000_000
    assert base.strategy.name == "ddp"    # as the paper: ZeRO saves no memory BERT-base needs and adds collectives
    base2 = compose("train", ["+experiment=bert_base_phase2"])
    assert base2.trainer.max_steps == 100_000 and base2.data.global_batch_size == 256
    assert base2.strategy.name == "ddp"
    large = compose("train", ["+experiment=bert_large"])
    assert (large.model.name, large.optimizer.name, large.data.global_batch_size, large.optimizer.lr) == \
        ("large", "lamb", 65536, 6e-3)
    assert (large.trainer.max_steps, large.scheduler.warmup_fraction) == (7038, 0.2843)
    assert large.strategy.name == "ddp" and large.scheduler.power == 0.5
    large2 = compose("train", ["+experiment=bert_large_phase2"])
    assert (large2.data.global_batch_size, large2.optimizer.lr, large2.trainer.max_steps,
            large2.scheduler.warmup_fraction) == (32768, 4e-3, 1563, 0.128)
    assert round(0.128 * 1563) == 200 and round(0.2843 * 7038) == 2001


@pytest.mark.parametrize("name", DEBUG_PRESETS)
def test_every_debug_preset_composes(name):
    cfg = compose("train", [f"+debug={name}"])
    resolved(cfg, "model", "data", "trainer", "optimizer", "scheduler")


def test_unknown_config_option_is_hydras_error():
    from hydra.errors import MissingConfigException
    with pytest.raises(MissingConfigException, match="huge"):
        compose("train", ["model=huge"])


@pytest.mark.parametrize("global_batch,most,world,expected", [
    (256, 32, 8, (32, 1)), (256, 8, 8, (8, 4)), (256, 32, 32, (8, 1)), (256, 32, 64, (4, 1)),
    (65536, 64, 8, (64, 128)), (32768, 8, 16, (8, 256)), (8, 4, 1, (4, 2)), (10, 4, 1, (2, 5)), (12, 5, 2, (3, 2))])
def test_batch_split(global_batch, most, world, expected):
    micro, accumulation = batch_split(global_batch, most, world)
    assert (micro, accumulation) == expected
    assert micro * accumulation * world == global_batch and micro <= most


def test_a_global_batch_that_does_not_divide_over_the_processes_is_refused():
    with pytest.raises(ValueError, match=r"global_batch_size=100 does not divide over devices x nodes = 64 processes"):
        batch_split(100, 32, 64)


def test_lamb_with_zero_is_refused():
    cfg = compose("train", ["strategy=deepspeed_stage_2", "optimizer=lamb"])
    with pytest.raises(ValueError, match="trust ratio"):
        check_strategy_and_optimizer(cfg)
    # the schedule is the pipeline's under every strategy, so NVIDIA's polynomial decay works with ZeRO too
    check_strategy_and_optimizer(compose("train", ["strategy=deepspeed_stage_2", "scheduler=poly_warmup"]))


def test_deepspeeds_fused_lamb_is_refused_before_anything_runs_saying_why(monkeypatch):
    """DeepSpeed's FusedLamb is another algorithm than the recipe's lamb (trust ratio on biases and LayerNorm, clamped
    to [0.01, 10], bias correction) and needs nvcc: refused at preflight, on any device, under any strategy."""
    from pipeline.core.optim.optimizers import build_optimizer
    from pipeline.pretraining.checks import preflight

    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    why = (r"optimizer=fused_lamb: DeepSpeed's FusedLamb is not this pipeline's LAMB .* biases and LayerNorm .* "
           r"\[0\.01, 10\]")
    for overrides in (["optimizer=fused_lamb"],
                      ["+experiment=bert_large", "optimizer=fused_lamb", "trainer.devices=8"]):
        with pytest.raises(ValueError, match=why):
            preflight(compose("train", overrides), world_size=8)
    with pytest.raises(ValueError, match=why):
        build_optimizer(tiny_model(), {"name": "fused_lamb", "lr": 1e-3})


# ---------------------------------------------------------------------------------------------------------
# optimizers and schedules

def tiny_model():
    from model import BertConfig, BertForPreTraining
    torch.manual_seed(0)
    return BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=64, max_position_embeddings=32))


def test_no_weight_decay_on_biases_and_layer_norms():
    model = tiny_model()
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    not_decayed = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert "bert.embeddings.layer_norm.weight" in not_decayed and "bert.embeddings.layer_norm.bias" in not_decayed
    assert all(n.endswith("bias") or "norm" in n for n in not_decayed)
    assert all(n.endswith("weight") and "norm" not in n for n in decayed)
    assert "bert.embeddings.word_embeddings.weight" in decayed    # tied with the MLM decoder: counted once
    assert len(decayed) + len(not_decayed) == len(list(model.parameters()))


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_optimizers_step(name):
    if name == "lamb":
        pytest.importorskip("pytorch_optimizer")
    model = tiny_model()
    cfg = OmegaConf.to_container(compose("train", [f"optimizer={name}"]).optimizer, resolve=True)
    optimizer = build_optimizer(model, cfg)
    before = [p.detach().clone() for p in model.parameters()]
    ids = torch.randint(0, 64, (2, 16))
    out = model(ids, masked_positions=torch.tensor([[1, 2], [3, 4]]), masked_lm_labels=torch.tensor([[5, 6], [7, 8]]),
                next_sentence_labels=torch.tensor([0, 1]))
    out.loss.backward()
    optimizer.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_lamb_update_is_layerwise_adaptive():
    """Each decayed tensor moves by lr * ||w|| (the trust ratio), whatever its gradient's scale; the
    no-decay tensors take a plain (uncorrected) Adam step, as apex FusedLAMB's use_nvlamb=False."""
    pytest.importorskip("pytorch_optimizer")
    model = tiny_model()
    optimizer = build_optimizer(model, {"name": "lamb", "lr": 0.01, "weight_decay": 0.01, "trust_clamp": 1e9})
    for i, p in enumerate(model.parameters()):
        magnitude = (torch.rand_like(p) + 0.5) * 10.0 ** (i % 3)   # far above eps, scales differing per tensor
        p.grad = torch.where(torch.rand_like(p) < 0.5, -magnitude, magnitude)
    decay, no_decay = optimizer.param_groups
    before = {id(p): p.detach().clone() for p in model.parameters()}
    optimizer.step()
    for p in decay["params"]:
        assert (p.detach() - before[id(p)]).norm().item() == pytest.approx(0.01 * before[id(p)].norm().item(),
                                                                           rel=1e-3)
    for p in no_decay["params"]:   # m / sqrt(v) at step 1 = sqrt(1 - 0.999) / (1 - 0.9) * sign(g) = 3.16 sign(g)
        step = (p.detach() - before[id(p)]).abs()
        assert torch.allclose(step, torch.full_like(step, 0.01 * 0.1 / math.sqrt(0.001)), rtol=1e-3)


def test_schedule_shapes():
    assert [lr_factor(s, 4, 10) for s in range(11)] == pytest.approx(
        [0, 0.25, 0.5, 0.75, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6, 0.0])
    assert lr_factor(7, 4, 10, power=0.5) == pytest.approx(math.sqrt(0.5))
    assert lr_factor(3, 0, 10) == pytest.approx(0.7)


def test_scheduler_steps_per_optimizer_step_and_pickles():
    import pickle
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    scheduler = build_scheduler(optimizer, {"name": "linear_warmup", "warmup_steps": None,
                                            "warmup_fraction": 0.2, "power": 1.0}, max_steps=10)
    lrs = []
    for _ in range(10):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0, 0.5, 1.0, 7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8])
    pickle.dumps(scheduler.state_dict())


def test_bad_schedules_are_refused():
    optimizer = torch.optim.AdamW(tiny_model().parameters(), lr=1.0)
    with pytest.raises(ValueError, match="not both"):
        build_scheduler(optimizer, {"warmup_steps": 2, "warmup_fraction": 0.1}, max_steps=10)
    with pytest.raises(ValueError, match="warmup_steps"):
        build_scheduler(optimizer, {"warmup_steps": 10}, max_steps=10)


def test_peak_flops_resolution():
    from model import PEAK_FLOPS
    from pipeline.core.speed.throughput import resolve_peak_flops
    cpu = torch.device("cpu")
    assert resolve_peak_flops(None, cpu) is None                       # no MFU on the CPU
    assert resolve_peak_flops("h100-sxm", cpu) == PEAK_FLOPS["h100-sxm"]
    assert resolve_peak_flops("3.12e14", cpu) == 3.12e14 and resolve_peak_flops(1e12, cpu) == 1e12
    with pytest.raises(ValueError, match="neither FLOP/s nor one of"):
        resolve_peak_flops("b200", cpu)


def test_each_model_preset_starts_from_its_own_rate():
    """One default rate for every size kept BERT-mini on the unigram plateau; each preset now names its own, and an
    explicit optimizer.lr still wins."""
    rates = {name: compose("train", [f"model={name}"]).optimizer.lr for name in ("tiny", "mini", "base", "large")}
    assert rates == {"tiny": 1e-3, "mini": 6e-4, "base": 1e-4, "large": 1e-4}
    assert compose("train", ["model=mini", "optimizer.lr=3e-4"]).optimizer.lr == 3e-4
    assert "pretraining_lr" not in model_config_of(compose("train", ["model=mini"])).to_dict()
