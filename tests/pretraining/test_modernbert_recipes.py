"""ModernBERT's recipes (+experiment=modernbert_{base,large}{,_context_extension,_decay}) at the shapes users run
them: every phase passes pre-training's pre-flight checks at 1, 4 and 8 nodes of 8 GPUs, or is refused there before
anything runs, saying why; the steps their comments state are the published token budgets, computed by the batch
warm-up's own arithmetic; and each decay phase differs from the stable run it resumes only in what it accepts."""
from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from pipeline.core.app import compose
from pipeline.core.run.shaping import OPERATIONAL, leaves, without_keys
from pipeline.pretraining.checks import preflight
from pipeline.pretraining.data.batch_warmup import BatchWarmup

PHASES = ("", "_context_extension", "_decay")
SIZES = ("base", "large")
# Where a phase's batch does not split: ModernBERT-large's 616 sequences of 8,192 tokens (77 a GPU on its 8)
REFUSED = {("large", "_context_extension", 4), ("large", "_context_extension", 8), ("large", "_decay", 4),
           ("large", "_decay", 8)}


def recipe(size: str, phase: str, *overrides: str):
    extra = {"_context_extension": ["init_from_checkpoint=/phase1/checkpoints/last.ckpt"],
             "_decay": ["resume.continue_from=/phase2/checkpoints/last.ckpt"]}.get(phase, [])
    return compose("train", [f"+experiment=modernbert_{size}{phase}", *extra, *overrides])


@pytest.fixture(autouse=True)
def wandb_key(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)   # the recipes log online; the key's presence is what is checked


@pytest.mark.parametrize("nodes", (1, 4, 8))
@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("size", SIZES)
def test_every_phase_passes_preflight_at_its_cluster_shapes_or_is_refused_saying_why(size, phase, nodes):
    cfg = recipe(size, phase, "trainer.devices=8", f"trainer.num_nodes={nodes}")
    if (size, phase, nodes) in REFUSED:
        with pytest.raises(ValueError, match=f"global_batch_size=616 does not divide over .* {8 * nodes} processes"):
            preflight(cfg, world_size=8 * nodes)
        return
    shape = preflight(cfg, world_size=8 * nodes)
    assert shape.micro_batch_size * shape.accumulation * 8 * nodes == cfg.data.global_batch_size
    assert shape.trainer_cfg["precision"] == "bf16-mixed"
    assert (cfg.strategy.name, cfg.optimizer.name, cfg.trainer.gradient_clip_val) == ("ddp", "stable_adamw", 0)


@pytest.mark.parametrize("size, lr, batch, ramp_tokens, start, warmup_tokens",
                         [("base", 8e-4, 4608, 50e9, 768, 3e9), ("large", 5e-4, 4928, 10e9, 448, 2e9)])
def test_phase_one_is_the_published_budget_in_steps(size, lr, batch, ramp_tokens, start, warmup_tokens):
    """1.719T tokens of 1,024-token rows, the batch ramped from `start` over `ramp_tokens`, the rate warmed up over
    `warmup_tokens` then held (no decay: phase 3 decays), RoPE theta 10k on every layer."""
    cfg = recipe(size, "")
    warmup = BatchWarmup.from_config(cfg.data)
    assert (cfg.optimizer.lr, cfg.data.global_batch_size, cfg.data.max_seq_length) == (lr, batch, 1024)
    assert (warmup.tokens, warmup.start_batch_size, warmup.increment) == (ramp_tokens, start, start)

    def tokens_before(step: int) -> int:      # rows of the steps before `step` x 1,024
        ramp = warmup.ramp_steps
        rows = warmup.offset(min(step, ramp)) + max(0, step - ramp) * batch
        return rows * 1024

    steps = cfg.trainer.max_steps
    assert tokens_before(steps - 1) < 1.719e12 <= tokens_before(steps)
    warmup_steps = cfg.scheduler.warmup_steps
    assert tokens_before(warmup_steps - 1) < warmup_tokens <= tokens_before(warmup_steps)
    assert (cfg.scheduler.decay_steps, cfg.model.global_rope_theta, cfg.model.local_rope_theta) == (0, 1e4, 1e4)
    assert cfg.seed == 17


@pytest.mark.parametrize("size, lr, batch", [("base", 3e-4, 576), ("large", 5e-5, 616)])
def test_the_context_extension_and_its_decay_are_the_published_budgets_in_steps(size, lr, batch):
    """250B tokens of 8,192-token rows held at the phase's rate (theta 160k global / 10k local), then 50B decayed with
    1-sqrt to 0.001 of it, resumed from the extension's last step."""
    extension, decay = recipe(size, "_context_extension"), recipe(size, "_decay")
    per_step = batch * 8192
    for cfg in (extension, decay):
        assert (cfg.optimizer.lr, cfg.data.global_batch_size, cfg.data.max_seq_length) == (lr, batch, 8192)
        assert (cfg.model.global_rope_theta, cfg.model.local_rope_theta) == (1.6e5, 1e4)
    assert extension.trainer.max_steps == math.ceil(250e9 / per_step) and extension.scheduler.decay_steps == 0
    assert decay.scheduler.decay_steps == math.ceil(50e9 / per_step)
    assert decay.trainer.max_steps == extension.trainer.max_steps + decay.scheduler.decay_steps
    assert (decay.scheduler.decay_shape, decay.scheduler.min_lr_ratio) == ("1-sqrt", 0.001)


@pytest.mark.parametrize("size", SIZES)
def test_a_decay_phase_differs_from_the_run_it_resumes_only_in_what_it_accepts(size):
    """What shapes the run (its config but the operational keys and the logger's name) differs between the decay and
    the context extension whose checkpoint it resumes in exactly the keys the decay's resume.accept_changes lists:
    the resume check would refuse anything else, at the cluster's first start of phase 3."""
    def shaping(cfg) -> dict:
        del cfg.output_dir                       # Hydra's run directory: no run here, and operational anyway
        container = OmegaConf.to_container(cfg, resolve=True)
        return dict(leaves(without_keys(container, (*OPERATIONAL["train"], "init_from_checkpoint", "logger"))))

    extension, decay = shaping(recipe(size, "_context_extension")), shaping(recipe(size, "_decay"))
    changed = {key for key in extension.keys() | decay.keys() if extension.get(key) != decay.get(key)}
    assert changed == set(recipe(size, "_decay").resume.accept_changes)


@pytest.mark.parametrize("size", SIZES)
def test_a_decay_phase_without_the_run_it_continues_is_refused(size):
    with pytest.raises(ValueError, match="continues a stable phase's run .* resume.continue_from="):
        preflight(compose("train", [f"+experiment=modernbert_{size}_decay"]), world_size=8)


def test_a_context_extension_without_phase_one_weights_is_refused():
    with pytest.raises(ValueError, match="phase 2 from phase 1"):
        preflight(compose("train", ["+experiment=modernbert_base_context_extension"]), world_size=8)
