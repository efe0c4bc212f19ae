"""pipeline/core/strategies.py: DeepSpeed configs from conf/training/strategy/*.yaml, the strategies built from them, and real
2-process runs on CPU (DDP over gloo; DeepSpeed ZeRO 2 and 3 through CPUDeepSpeedStrategy)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from lightning_fabric.plugins.environments import LightningEnvironment
from omegaconf import OmegaConf
from pytorch_lightning.accelerators import CPUAccelerator
from pytorch_lightning.strategies import DDPStrategy, DeepSpeedStrategy

from pipeline.core.app import TRAINING_CONFIGS, compose
from pipeline.core.cpu_deepspeed import CPUDeepSpeedStrategy
from pipeline.core.strategies import build_strategy, deepspeed_config

REPO_ROOT = Path(__file__).resolve().parents[2]
STRATEGY_DIR = TRAINING_CONFIGS / "strategy"

OPTIMIZER = {"name": "adamw", "lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01,
             "warmup_steps": 10000, "total_steps": 1000000}

_BUCKETS = {"allgather_partitions": True, "allgather_bucket_size": 200000000, "reduce_scatter": True,
            "reduce_bucket_size": 200000000, "overlap_comm": True, "contiguous_gradients": True}
_STAGE_3 = {"stage": 3, "reduce_scatter": True, "reduce_bucket_size": 200000000, "overlap_comm": True,
            "contiguous_gradients": True, "sub_group_size": 1000000000000,
            "stage3_prefetch_bucket_size": 50000000, "stage3_param_persistence_threshold": 100000,
            "stage3_max_live_parameters": 1000000000, "stage3_max_reuse_distance": 1000000000,
            "stage3_gather_16bit_weights_on_model_save": False}
_OFFLOAD = {"device": "cpu", "pin_memory": True}
ZERO_SECTIONS = {
    "deepspeed_stage_1": {"stage": 1, **_BUCKETS},
    "deepspeed_stage_2": {"stage": 2, **_BUCKETS},
    "deepspeed_stage_2_offload": {"stage": 2, **_BUCKETS, "offload_optimizer": _OFFLOAD},
    "deepspeed_stage_3": _STAGE_3,
    "deepspeed_stage_3_offload": {**_STAGE_3, "offload_optimizer": _OFFLOAD, "offload_param": _OFFLOAD},
}
PRECISION_SECTIONS = {
    "bf16-mixed": {"bf16": {"enabled": True}, "fp16": {"enabled": False}},
    "16-mixed": {"bf16": {"enabled": False},
                 "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                          "hysteresis": 2, "min_loss_scale": 1}},
    "32": {"bf16": {"enabled": False}, "fp16": {"enabled": False}},
}


def load(name: str):
    """A strategy file as training composes it (the DeepSpeed files start from strategy/deepspeed/common.yaml)."""
    return OmegaConf.create(OmegaConf.to_container(compose("train", [f"strategy={name}"]).strategy))


def build_config(name: str, precision: str = "32", accelerator: str = "cuda", optimizer=None, **overrides):
    kwargs = dict(precision=precision, gradient_clip_val=1.0, micro_batch_size=32, accumulate_grad_batches=4,
                  optimizer_cfg=OPTIMIZER if optimizer is None else optimizer, accelerator=accelerator)
    return deepspeed_config(load(name), **{**kwargs, **overrides})


def test_every_strategy_file_is_covered():
    assert {p.stem for p in STRATEGY_DIR.glob("*.yaml")} == {"auto", "ddp", *ZERO_SECTIONS}


@pytest.mark.parametrize("precision", sorted(PRECISION_SECTIONS))
@pytest.mark.parametrize("name", sorted(ZERO_SECTIONS))
def test_deepspeed_config_exact(name, precision):
    assert build_config(name, precision) == {
        "train_micro_batch_size_per_gpu": 32,
        "gradient_accumulation_steps": 4,
        "gradient_clipping": 1.0,
        "zero_optimization": ZERO_SECTIONS[name],
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1000,
        "wall_clock_breakdown": False,
        **PRECISION_SECTIONS[precision],
        # type AdamW: DeepSpeed builds FusedAdam on CUDA (DeepSpeedCPUAdam when the optimizer state is offloaded).
        # lr 0.0 is the first step's rate; the scheduler, starting at iteration 0, holds the peak rate.
        "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "betas": [0.9, 0.999], "eps": 1e-6,
                                                  "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-4,
                                                          "warmup_num_steps": 10000, "total_num_steps": 1000000,
                                                          "warmup_type": "linear", "last_batch_iteration": 0}},
    }


@pytest.mark.parametrize("name", sorted(ZERO_SECTIONS))
def test_cpu_config_uses_torch_adamw_unless_offloading(name):
    params = build_config(name, accelerator="cpu")["optimizer"]["params"]
    if "offload" in name:
        assert "torch_adam" not in params          # ZeRO-Offload steps with DeepSpeedCPUAdam
    else:
        assert params["torch_adam"] is True        # torch.optim.AdamW: no JIT build of DeepSpeed's CPU FusedAdam


@pytest.mark.parametrize("name", ["lamb", "fused_lamb", "LAMB"])
def test_lamb_is_fused_lamb_without_zero_partitioning_on_cuda_only(name):
    lamb = {**OPTIMIZER, "name": name, "lr": 6e-3}
    stage_0 = load("deepspeed_stage_1")
    stage_0.zero_optimization = {"stage": 0}
    config = deepspeed_config(stage_0, precision="bf16-mixed", gradient_clip_val=1.0, micro_batch_size=8,
                              accumulate_grad_batches=1, optimizer_cfg=lamb)
    assert config["optimizer"] == {"type": "Lamb", "params": {"lr": 0.0, "betas": [0.9, 0.999], "eps": 1e-6,
                                                              "weight_decay": 0.01}}
    assert config["scheduler"]["params"]["warmup_max_lr"] == 6e-3
    with pytest.raises(ValueError, match="per-tensor trust ratio"):
        build_config("deepspeed_stage_1", optimizer=lamb)
    with pytest.raises(ValueError, match="FusedLamb, which needs CUDA"):
        deepspeed_config(stage_0, precision="32", gradient_clip_val=1.0, micro_batch_size=8,
                         accumulate_grad_batches=1, optimizer_cfg=lamb, accelerator="cpu")


def test_clipping_batch_and_accumulation_come_from_the_arguments():
    config = build_config("deepspeed_stage_1", gradient_clip_val=None, micro_batch_size=7, accumulate_grad_batches=3)
    assert (config["gradient_clipping"], config["train_micro_batch_size_per_gpu"],
            config["gradient_accumulation_steps"]) == (0.0, 7, 3)


def test_optimizer_left_to_lightning_when_asked():
    cfg = load("deepspeed_stage_2")
    cfg.optimizer_in_ds_config = False
    config = deepspeed_config(cfg, precision="bf16-mixed", gradient_clip_val=1.0, micro_batch_size=8,
                              accumulate_grad_batches=1, optimizer_cfg=None)
    assert "optimizer" not in config and "scheduler" not in config


def test_deepspeed_scheduler_runs_the_reference_schedule(monkeypatch):
    """Built the way DeepSpeed's engine builds it (type + params from the config, on the config optimizer), stepped
    once per optimizer step: step k runs at the reference rate (no lag of one step)."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime import lr_schedules

    config = build_config("deepspeed_stage_2", optimizer={**OPTIMIZER, "lr": 1e-3, "warmup_steps": 4,
                                                          "total_steps": 10})
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=config["optimizer"]["params"]["lr"])
    scheduler = getattr(lr_schedules, config["scheduler"]["type"])(optimizer, **config["scheduler"]["params"])
    lrs = []
    for _ in range(11):
        lrs.append(optimizer.param_groups[0]["lr"])
        scheduler.step()
    assert lrs == pytest.approx(reference_lrs(1e-3, warmup=4, total=10, steps=11, accumulate=1))
    assert lrs[:5] == pytest.approx([0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3]) and lrs[-1] == 0.0


@pytest.mark.parametrize("change, message", [
    ({"precision": "64-true"}, "not supported with DeepSpeed"),
    ({"optimizer": {**OPTIMIZER, "lr": None}}, r"lacks \['lr'\]"),
    ({"optimizer": {**OPTIMIZER, "name": "sgd"}}, "must be one of"),
    ({"optimizer": {**OPTIMIZER, "warmup_steps": 0}}, "2 <= warmup_steps < total_steps"),
    ({"optimizer": {**OPTIMIZER, "warmup_steps": 1}}, "2 <= warmup_steps < total_steps"),
    ({"optimizer": {k: v for k, v in OPTIMIZER.items() if k != "total_steps"}}, "total_steps"),
    ({"micro_batch_size": 0}, "must be >= 1"),
])
def test_bad_settings_are_refused(change, message):
    kwargs = {"precision": change.pop("precision", "32"), "optimizer": change.pop("optimizer", None), **change}
    with pytest.raises(ValueError, match=message):
        build_config("deepspeed_stage_2", **kwargs)


def test_unknown_strategy_keys_are_refused():
    cfg = load("deepspeed_stage_2")
    cfg.zero_optimisation = {"stage": 2}
    with pytest.raises(ValueError, match="unknown keys"):
        build_strategy(cfg, precision="32", gradient_clip_val=None, micro_batch_size=1, accumulate_grad_batches=1,
                       optimizer_cfg=OPTIMIZER)


@pytest.mark.parametrize("precision", sorted(PRECISION_SECTIONS))
@pytest.mark.parametrize("name", sorted(ZERO_SECTIONS))
def test_deepspeed_parses_every_config(name, precision, monkeypatch):
    """DeepSpeed's own config parser (pydantic, extra keys forbidden) accepts each config and reads it as meant."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.config import DeepSpeedConfig

    parsed = DeepSpeedConfig(build_config(name, precision))
    assert parsed.zero_optimization_stage == ZERO_SECTIONS[name]["stage"]
    assert parsed.bfloat16_config.enabled is (precision == "bf16-mixed")
    assert parsed.float16_config.enabled is (precision == "16-mixed")
    assert parsed.train_batch_size == 32 * 4                      # world size 1 here
    assert (parsed.optimizer_name, parsed.scheduler_name) == ("adamw", "WarmupDecayLR")
    assert (parsed.zero_config.offload_optimizer is not None) is ("offload" in name)
    assert (parsed.zero_config.offload_param is not None) is (name == "deepspeed_stage_3_offload")


@pytest.mark.parametrize("name", ["auto", "ddp", *sorted(ZERO_SECTIONS)])
def test_strategy_files_compose_as_a_hydra_group(name):
    cfg = OmegaConf.to_container(load(name))
    assert cfg["name"] == ("deepspeed" if name.startswith("deepspeed") else name)
    if name in ZERO_SECTIONS:   # each stage's own section over the shared base, nothing lost or added
        assert cfg["zero_optimization"] == ZERO_SECTIONS[name]
        common = OmegaConf.to_container(OmegaConf.load(STRATEGY_DIR / "deepspeed" / "common.yaml"))
        assert {k: v for k, v in cfg.items() if k != "zero_optimization"} == \
            {k: v for k, v in common.items() if k != "zero_optimization"}


# ---------------------------------------------------------------------------------------------- build_strategy

def _build(name: str, accelerator: str, **kwargs):
    return build_strategy(load(name), precision=kwargs.pop("precision", "bf16-mixed"), gradient_clip_val=1.0,
                          micro_batch_size=8, accumulate_grad_batches=2, optimizer_cfg=OPTIMIZER,
                          accelerator=accelerator)


def test_build_auto():
    assert _build("auto", "cpu") == "auto"


@pytest.mark.parametrize("accelerator, backend", [("cpu", "gloo"), ("cuda", "nccl"), ("gpu", "nccl")])
def test_build_ddp(accelerator, backend):
    strategy = _build("ddp", accelerator)
    assert type(strategy) is DDPStrategy
    assert strategy._process_group_backend == backend
    assert strategy._ddp_kwargs == {"find_unused_parameters": False, "gradient_as_bucket_view": True,
                                    "static_graph": False}


@pytest.mark.parametrize("accelerator, strategy_class", [("cpu", CPUDeepSpeedStrategy), ("cuda", DeepSpeedStrategy)])
def test_build_deepspeed(accelerator, strategy_class, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    strategy = _build("deepspeed_stage_3", accelerator)
    assert type(strategy) is strategy_class
    assert strategy._process_group_backend == {"cpu": "gloo", "cuda": "nccl"}[accelerator]
    expected = deepspeed_config(load("deepspeed_stage_3"), precision="bf16-mixed", gradient_clip_val=1.0,
                                micro_batch_size=8, accumulate_grad_batches=2, optimizer_cfg=OPTIMIZER,
                                accelerator=accelerator)
    # Lightning refuses a config holding gradient_accumulation_steps: it sets it from Trainer(accumulate_grad_batches)
    del expected["gradient_accumulation_steps"]
    assert strategy.config == expected
    assert strategy.zero_stage_3


# ---------------------------------------------------------------------------------------------- the CPU overrides

def _cpu_strategy(n: int = 2) -> CPUDeepSpeedStrategy:
    return CPUDeepSpeedStrategy(accelerator=CPUAccelerator(), parallel_devices=[torch.device("cpu")] * n,
                                cluster_environment=LightningEnvironment(),
                                config=build_config("deepspeed_stage_2", accelerator="cpu"))


def test_cpu_strategy_overrides_only_the_three_cuda_assumptions():
    overridden = {k for k in vars(CPUDeepSpeedStrategy) if callable(getattr(DeepSpeedStrategy, k, None))}
    assert overridden == {"setup_environment", "setup_distributed", "_setup_model_and_optimizer",
                          "_initialize_deepspeed_inference"}


def test_override_1_cpu_accelerator_is_accepted(monkeypatch):
    calls = []
    monkeypatch.setattr(DeepSpeedStrategy, "setup_distributed", lambda self: calls.append(type(self)))
    strategy = DeepSpeedStrategy(accelerator=CPUAccelerator(), parallel_devices=[torch.device("cpu")])
    with pytest.raises(RuntimeError, match="only supported on CUDA GPUs"):
        strategy.setup_environment()
    monkeypatch.setattr(CPUDeepSpeedStrategy, "setup_distributed", lambda self: calls.append(type(self)))
    _cpu_strategy(1).setup_environment()
    assert calls == [CPUDeepSpeedStrategy]


def test_override_2_cpu_devices_need_no_cuda_index(monkeypatch):
    inits = []
    monkeypatch.setattr(DeepSpeedStrategy, "_init_deepspeed_distributed", lambda self: inits.append(self.world_size))
    parent = DeepSpeedStrategy(accelerator=CPUAccelerator(), parallel_devices=[torch.device("cpu")] * 2,
                               cluster_environment=LightningEnvironment())
    with pytest.raises(RuntimeError, match="device indices"):
        parent.setup_distributed()
    _cpu_strategy(2).setup_distributed()
    assert inits == [2]


@pytest.mark.parametrize("local_rank", [0, 1])
def test_override_3_deepspeed_initialize_gets_the_local_rank(local_rank, monkeypatch):
    import deepspeed

    device_ranks = []

    def fake_initialize(*, args, model, **kwargs):
        device_ranks.append(args.device_rank)
        return model, "optimizer", None, None

    monkeypatch.setattr(deepspeed, "initialize", fake_initialize)
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))           # read by Lightning's LightningEnvironment
    strategy = _cpu_strategy(2)
    model = torch.nn.Linear(2, 2)
    strategy._setup_model_and_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.1))   # fit set-up
    strategy._initialize_deepspeed_inference(model)                                          # eval set-up
    assert device_ranks == [local_rank, local_rank]
    assert deepspeed.initialize is fake_initialize               # the wrapper is gone afterwards


# ---------------------------------------------------------------------------------------------- 2-process runs

# One script for both runs: a tiny regression LightningModule trained by 2 CPU processes (Lightning's subprocess
# launcher re-runs this file for rank 1), with the strategy from build_strategy and a conf/strategy file.
RUN_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch
    import pytorch_lightning as pl
    from omegaconf import OmegaConf
    from torch.utils.data import DataLoader, TensorDataset
    from pipeline.core.strategies import build_strategy

    out_dir, strategy_name = sys.argv[1], sys.argv[2]
    MAX_STEPS, ACCUMULATE, MICRO_BATCH = 5, 2, 4
    OPTIMIZER = dict(name="adamw", lr=0.01, betas=[0.9, 0.98], eps=1e-6, weight_decay=0.01,
                     warmup_steps=2, total_steps=4)


    class Tiny(pl.LightningModule):
        def __init__(self, optimizer_in_ds_config):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                                           torch.nn.Linear(32, 1))
            self.optimizer_in_ds_config, self.lrs = optimizer_in_ds_config, []

        def training_step(self, batch, batch_idx):
            self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

        def configure_optimizers(self):
            assert not self.optimizer_in_ds_config, "not called when the DeepSpeed config holds the optimizer"
            return torch.optim.AdamW(self.parameters(), lr=0.01)


    def data(seed):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(seed))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=MICRO_BATCH)


    from pipeline.core.app import compose
    strategy_cfg = compose("train", [f"strategy={strategy_name}"]).strategy
    deepspeed = strategy_cfg.name == "deepspeed"


    def trainer():
        strategy = build_strategy(strategy_cfg, precision="32", gradient_clip_val=1.0, micro_batch_size=MICRO_BATCH,
                                  accumulate_grad_batches=ACCUMULATE, optimizer_cfg=OPTIMIZER, accelerator="cpu")
        return pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, precision="32", max_steps=MAX_STEPS,
                          accumulate_grad_batches=ACCUMULATE, gradient_clip_val=1.0, logger=False,
                          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                          num_sanity_val_steps=0, default_root_dir=out_dir)


    pl.seed_everything(0)
    model = Tiny(deepspeed)
    initial = {k: v.detach().clone() for k, v in model.named_parameters()}
    fit = trainer()
    fit.fit(model, train_dataloaders=data(1))
    rank = fit.global_rank
    report = {"rank": rank, "world_size": fit.world_size, "backend": torch.distributed.get_backend(),
              "strategy": type(fit.strategy).__name__, "global_step": fit.global_step, "lrs": model.lrs}
    if deepspeed:
        import deepspeed as ds
        engine = fit.strategy.deepspeed_engine
        report.update(zero_stage=engine.zero_optimization_stage(), ds_config=fit.strategy.config,
                      optimizer=type(engine.optimizer.optimizer).__name__,
                      ds_optimizer=type(engine.optimizer).__name__,
                      gradient_accumulation_steps=engine.gradient_accumulation_steps(),
                      gradient_clipping=engine.gradient_clipping())
        with ds.zero.GatheredParameters(list(model.parameters()), enabled=report["zero_stage"] == 3):
            weights = {k: v.detach().clone() for k, v in model.named_parameters()}
        ckpt = os.path.join(out_dir, "sharded.ckpt")
        fit.save_checkpoint(ckpt)                           # one shard per rank
        fit.strategy.barrier()
        if rank == 0:
            from pytorch_lightning.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict
            convert_zero_checkpoint_to_fp32_state_dict(ckpt, os.path.join(out_dir, "consolidated.pt"))
        # The evaluation set-up (DeepSpeed engine without optimizer). ZeRO 2: a fresh model loads the sharded
        # checkpoint. ZeRO 3: DeepSpeed 0.19.8 cannot load a ZeRO-3 checkpoint into an engine without optimizer
        # (DeepSpeedZeRoOffload has no _restore_from_bit16_weights), so the trained model is evaluated as it is.
        pl.seed_everything(123)
        if report["zero_stage"] == 3:
            metrics = trainer().validate(model, dataloaders=data(2), verbose=False)
        else:
            metrics = trainer().validate(Tiny(True), dataloaders=data(2), ckpt_path=ckpt, verbose=False)
        report["val_loss"] = metrics[0]["val_loss"]
    else:
        weights = {k: v.detach().clone() for k, v in model.named_parameters()}
        report["ddp_kwargs"] = fit.strategy._ddp_kwargs
    torch.save({"initial": initial, "final": weights}, os.path.join(out_dir, f"weights-rank{rank}.pt"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
''')


def run_two_processes(tmp_path: Path, strategy_name: str, torch_extensions_dir: str, timeout_s: int
                      ) -> tuple[list[dict], Path]:
    script = tmp_path / "run.py"
    script.write_text(RUN_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    launcher_vars = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                     "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in launcher_vars}
    env.update(PYTHONPATH=str(REPO_ROOT), DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=torch_extensions_dir,
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run([sys.executable, str(script), str(out), strategy_name], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"2-process {strategy_name} run timed out after {timeout_s} s:\n{(e.stdout or '')[-4000:]}"
                    f"\n{(e.stderr or '')[-4000:]}")
    log = f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0, log
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)], out


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
def test_ddp_two_cpu_processes(tmp_path, torch_extensions_dir):
    ranks, out = run_two_processes(tmp_path, "ddp", torch_extensions_dir, timeout_s=300)
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert (r["world_size"], r["backend"], r["strategy"], r["global_step"]) == (2, "gloo", "DDPStrategy", 5)
        assert r["ddp_kwargs"]["find_unused_parameters"] is False
    w0, w1 = (torch.load(out / f"weights-rank{r}.pt") for r in (0, 1))
    assert_same_weights(w0["final"], w1["final"])                      # gradients were all-reduced
    assert not torch.equal(w0["final"]["net.0.weight"], w0["initial"]["net.0.weight"])


def reference_lrs(lr: float, warmup: int, total: int, steps: int, accumulate: int) -> list[float]:
    """The rate of each micro-batch: optimizer step k at lr * k / warmup, then lr * (total - k) / (total - warmup),
    as google-research/bert and pipeline/core/optim.py; the same for all micro-batches of one optimizer step."""
    def at(k: int) -> float:
        return lr * (k / warmup if k < warmup else max(0.0, (total - k) / (total - warmup)))
    return [at(k) for k in range(steps) for _ in range(accumulate)]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_two_cpu_processes_checkpoint_consolidates_exactly(stage, tmp_path, torch_extensions_dir):
    ranks, out = run_two_processes(tmp_path, f"deepspeed_stage_{stage}", torch_extensions_dir, timeout_s=540)
    expected_config = build_config(f"deepspeed_stage_{stage}", "32", accelerator="cpu", micro_batch_size=4,
                                   accumulate_grad_batches=2,
                                   optimizer={"name": "adamw", "lr": 0.01, "betas": [0.9, 0.98], "eps": 1e-6,
                                              "weight_decay": 0.01, "warmup_steps": 2, "total_steps": 4})
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert (r["world_size"], r["backend"], r["strategy"]) == (2, "gloo", "CPUDeepSpeedStrategy")
        assert (r["zero_stage"], r["global_step"], r["gradient_accumulation_steps"]) == (stage, 5, 2)
        assert r["gradient_clipping"] == 1.0
        assert r["ds_config"] == expected_config       # what DeepSpeed got: ours, Lightning added only accumulation
        # the config's optimizer, wrapped by ZeRO (torch AdamW on CPU; FusedAdam on CUDA)
        assert r["optimizer"] == "AdamW"
        assert r["ds_optimizer"] == {2: "DeepSpeedZeroOptimizer", 3: "DeepSpeedZeroOptimizer_Stage3"}[stage]
        # DeepSpeed's WarmupDecayLR, stepped by Lightning once per optimizer step, runs the reference schedule
        assert r["lrs"] == pytest.approx(reference_lrs(0.01, warmup=2, total=4, steps=5, accumulate=2))

    w0, w1 = (torch.load(out / f"weights-rank{r}.pt") for r in (0, 1))
    assert_same_weights(w0["final"], w1["final"])
    assert not torch.equal(w0["final"]["net.0.weight"], w0["initial"]["net.0.weight"])
    assert sorted(p.name for p in (out / "sharded.ckpt" / "checkpoint").iterdir() if "optim_states" in p.name) == [
        f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]
    consolidated = torch.load(out / "consolidated.pt", weights_only=False)
    assert consolidated["global_step"] == 5
    assert_same_weights(consolidated["state_dict"], w0["final"])        # bit for bit

    # The evaluation engine on both ranks (override 3's second call site) computes the loss of these weights.
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    net.load_state_dict({k.removeprefix("net."): v for k, v in consolidated["state_dict"].items()})
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected_loss = torch.nn.functional.mse_loss(net(x), x.sum(1, keepdim=True).sin()).item()
    assert ranks[0]["val_loss"] == ranks[1]["val_loss"] == pytest.approx(expected_loss, rel=1e-5)
