"""pipeline/core/speed/strategies.py: DeepSpeed configs from conf/training/strategy/*.yaml, the strategies built from
them, and real 2-process runs on CPU (DDP over gloo; DeepSpeed ZeRO 2 and 3 through CPUDeepSpeedStrategy)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning_fabric.plugins.environments import LightningEnvironment
from omegaconf import OmegaConf
from pytorch_lightning.accelerators import CPUAccelerator
from pytorch_lightning.strategies import DDPStrategy, DeepSpeedStrategy

from pipeline.core.app import TRAINING_CONFIGS, compose
from pipeline.core.checkpoints.deepspeed_checkpoints import CompleteCheckpointsDeepSpeedStrategy
from pipeline.core.speed.cpu_deepspeed import CPUDeepSpeedStrategy
from pipeline.core.speed.strategies import build_strategy, deepspeed_config

REPO_ROOT = Path(__file__).resolve().parents[2]
STRATEGY_DIR = TRAINING_CONFIGS / "strategy"


# ZeRO-1/2's reduction bucket (deepspeed_stage_1.yaml): 5e7 elements, ZeRO-3 keeps common.yaml's 2e8
_BUCKETS = {"allgather_partitions": True, "allgather_bucket_size": 200000000, "reduce_scatter": True,
            "reduce_bucket_size": 50000000, "overlap_comm": True, "contiguous_gradients": True}
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
    # DDP's bf16-mixed: autocast over fp32 weights, fp32 gradients (tests/core/test_bf16_numerics.py)
    "bf16-mixed": {"bf16": {"enabled": False}, "fp16": {"enabled": False},
                   "torch_autocast": {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []},
                   "communication_data_type": "fp32", "data_types": {"grad_accum_dtype": "fp32"}},
    "16-mixed": {"bf16": {"enabled": False},
                 "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                          "hysteresis": 2, "min_loss_scale": 1}},
    "32": {"bf16": {"enabled": False}, "fp16": {"enabled": False}},
}


def load(name: str):
    """A strategy file as training composes it (the DeepSpeed files start from strategy/deepspeed/common.yaml)."""
    return OmegaConf.create(OmegaConf.to_container(compose("train", [f"strategy={name}"]).strategy))


def build_config(name: str, precision: str = "32", **overrides):
    kwargs = dict(precision=precision, gradient_clip_val=1.0, micro_batch_size=32, accumulate_grad_batches=4)
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
        "timers": {"throughput": {"enabled": False, "synchronized": False}},   # tests/core/test_deepspeed_timers.py
        **PRECISION_SECTIONS[precision],
        # no optimizer and no scheduler section: DeepSpeed wraps the LightningModule's (the same parameter groups
        # and schedule as every other strategy)
    }


def test_clipping_batch_and_accumulation_come_from_the_arguments():
    config = build_config("deepspeed_stage_1", gradient_clip_val=None, micro_batch_size=7, accumulate_grad_batches=3)
    assert (config["gradient_clipping"], config["train_micro_batch_size_per_gpu"],
            config["gradient_accumulation_steps"]) == (0.0, 7, 3)


@pytest.mark.parametrize("change, message", [
    ({"precision": "64-true"}, "not supported with DeepSpeed"),
    ({"micro_batch_size": 0}, "must be >= 1"),
    ({"gradient_clip_val": -1.0}, "gradient_clip_val must be >= 0"),
])
def test_bad_settings_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        build_config("deepspeed_stage_2", **change)


def test_unknown_strategy_keys_are_refused():
    cfg = load("deepspeed_stage_2")
    cfg.zero_optimisation = {"stage": 2}
    with pytest.raises(ValueError, match="unknown keys"):
        build_strategy(cfg, precision="32", gradient_clip_val=None, micro_batch_size=1, accumulate_grad_batches=1)


@pytest.mark.parametrize("precision", sorted(PRECISION_SECTIONS))
@pytest.mark.parametrize("name", sorted(ZERO_SECTIONS))
def test_deepspeed_parses_every_config(name, precision, monkeypatch):
    """DeepSpeed's own config parser (pydantic, extra keys forbidden) accepts each config and reads it as meant."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.config import DeepSpeedConfig

    parsed = DeepSpeedConfig(build_config(name, precision))
    assert parsed.zero_optimization_stage == ZERO_SECTIONS[name]["stage"]
    assert parsed.bfloat16_config.enabled is False                  # bf16-mixed is autocast, not DeepSpeed's cast
    assert parsed.torch_autocast_enabled is (precision == "bf16-mixed")
    assert parsed.float16_config.enabled is (precision == "16-mixed")
    assert parsed.train_batch_size == 32 * 4                      # world size 1 here
    assert (parsed.optimizer_name, parsed.scheduler_name) == (None, None)   # the LightningModule's, wrapped
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
                          micro_batch_size=8, accumulate_grad_batches=2, accelerator=accelerator)


def test_build_auto():
    assert _build("auto", "cpu") == "auto"


@pytest.mark.parametrize("accelerator, backend", [("cpu", "gloo"), ("cuda", "nccl"), ("gpu", "nccl")])
def test_build_ddp(accelerator, backend):
    strategy = _build("ddp", accelerator)
    assert type(strategy) is DDPStrategy
    assert strategy._process_group_backend == backend
    assert strategy._ddp_kwargs == {"find_unused_parameters": False, "gradient_as_bucket_view": True,
                                    "static_graph": False}


@pytest.mark.parametrize("accelerator, strategy_class", [("cpu", CPUDeepSpeedStrategy),
                                                         ("cuda", CompleteCheckpointsDeepSpeedStrategy)])
def test_build_deepspeed(accelerator, strategy_class, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    strategy = _build("deepspeed_stage_3", accelerator)
    assert type(strategy) is strategy_class
    assert strategy._process_group_backend == {"cpu": "gloo", "cuda": "nccl"}[accelerator]
    expected = deepspeed_config(load("deepspeed_stage_3"), precision="bf16-mixed", gradient_clip_val=1.0,
                                micro_batch_size=8, accumulate_grad_batches=2)
    # Lightning refuses a config holding gradient_accumulation_steps: it sets it from Trainer(accumulate_grad_batches)
    del expected["gradient_accumulation_steps"]
    assert strategy.config == expected
    assert strategy.zero_stage_3


@pytest.mark.parametrize("accelerator", ["cpu", "cuda"])
def test_a_deepspeed_strategy_that_cannot_be_built_stops_the_run_saying_why(accelerator, monkeypatch):
    """Never a silent fall-back to `auto` (it once caught the ImportError): Lightning's own check of the DeepSpeed
    install, made to fail as it does where the package is missing, reaches the caller with its message."""
    import pytorch_lightning.strategies.deepspeed as lightning_deepspeed
    from lightning_fabric.utilities.exceptions import MisconfigurationException

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setattr(lightning_deepspeed, "_DEEPSPEED_AVAILABLE", False)
    with pytest.raises(MisconfigurationException, match="you must have DeepSpeed installed"):
        _build("deepspeed_stage_2", accelerator)


# ---------------------------------------------------------------------------------------------- the CPU overrides

def _cpu_strategy(n: int = 2) -> CPUDeepSpeedStrategy:
    return CPUDeepSpeedStrategy(accelerator=CPUAccelerator(), parallel_devices=[torch.device("cpu")] * n,
                                cluster_environment=LightningEnvironment(),
                                config=build_config("deepspeed_stage_2"))


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
