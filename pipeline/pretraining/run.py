"""Entry point: pre-train BERT (masked LM + next sentence) on data_prep's shards, from Hydra configs in conf/.

    python pipeline/train.py                                  # tiny BERT, CPU, bundled sample, a few minutes
    python pipeline/train.py model=mini trainer.max_steps=2000 optimizer.lr=5e-4
    python pipeline/train.py +experiment=bert_base            # the paper's BERT-base phase 1, GPUs, DeepSpeed
    python pipeline/train.py +experiment=bert_large_phase2 init_from_checkpoint=<phase-1 run>/checkpoints/last.ckpt
    python pipeline/train.py +debug=dryrun                    # every stage of the pipeline in a few seconds
    python pipeline/train.py ckpt_path=<run>/checkpoints/last.ckpt hydra.run.dir=<run>   # resume, same logs

A run leaves, in its output directory: checkpoints/ (periodic step*.ckpt and last.ckpt), csv/metrics.csv,
curves.png, hf_export/ (transformers-loadable), wandb/ (if enabled) and Hydra's .hydra/ config record.

`train(cfg)` is the same run as a function (tests call it): it validates everything that can be checked before
training (model name, shard set present and matching the model, global batch divisible, phase-2 checkpoint,
W&B key) and returns the final metrics and the paths it wrote.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

from data_prep.known_noise import silence_known_noise  # noqa: E402

silence_known_noise()

import hydra  # noqa: E402
import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from omegaconf.errors import InterpolationResolutionError  # noqa: E402
from pytorch_lightning.callbacks import ModelCheckpoint  # noqa: E402

from model import PRESETS, BertConfig, BertForPreTraining  # noqa: E402
from pipeline.callbacks.progress import StepProgressBar  # noqa: E402
from pipeline.callbacks.throughput import ThroughputMonitor  # noqa: E402
from pipeline.export import PLOT_NAME, export_model, plot_curves  # noqa: E402
from pipeline.lightning_module import BertPretrainingModule  # noqa: E402
from pipeline.loggers import build_loggers, check_logger_config, csv_metrics_path, finish_wandb  # noqa: E402
from pipeline.loggers import wandb_environment  # noqa: E402
from pipeline.optim import warmup_steps_of  # noqa: E402

CONFIG_DIR = REPO_ROOT / "conf"
SAMPLE_SHARDS = REPO_ROOT / "outputs" / "shards" / "sample"
CHECKPOINT_DIR = "checkpoints"
# Trainer arguments that train() derives itself; setting them in trainer config would be silently overridden.
_DERIVED_TRAINER_KEYS = ("accumulate_grad_batches", "strategy", "logger", "callbacks", "default_root_dir")
log = logging.getLogger("pipeline.train")

if not OmegaConf.has_resolver("repo_root"):
    OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT))
# conf/ also holds data_prep's presets (conf/data_prep/) and the workflows (conf/workflow/), which Hydra would list
# among training's groups.
NOT_TRAINING_GROUPS = ("data_prep", "hydra", "workflow")


def training_config_groups() -> str:
    """The config groups of training, with their options, for `python pipeline/train.py --help`."""
    lines = []
    for group in sorted(p for p in CONFIG_DIR.iterdir() if p.is_dir() and p.name not in NOT_TRAINING_GROUPS):
        lines.append(f"{group.name}: {', '.join(sorted(o.stem for o in group.glob('*.yaml')))}")
    return "\n".join(lines)


if not OmegaConf.has_resolver("training_config_groups"):
    OmegaConf.register_new_resolver("training_config_groups", training_config_groups)


# ----------------------------------------------------------------------------------------------------------
# config

def compose_config(overrides: Sequence[str] = (), config_name: str = "train") -> DictConfig:
    """The config `python pipeline/train.py <overrides>` would run, without Hydra's run directory (so pass
    output_dir=... to train it)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


def model_config_of(cfg: DictConfig) -> BertConfig:
    fields = OmegaConf.to_container(cfg.model, resolve=True)
    name = fields.pop("name", None)
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(PRESETS)} (conf/model/)")
    return BertConfig.from_preset(name, **fields)


def devices_per_node(trainer_cfg: dict[str, Any]) -> int:
    """The number of devices Lightning will use on each node for this trainer config."""
    devices, accelerator = trainer_cfg.get("devices", "auto"), trainer_cfg.get("accelerator", "auto")
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str) and "," in devices:
        return len([d for d in devices.split(",") if d.strip()])
    if devices in ("auto", -1, "-1"):
        wants_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
        if not wants_gpu:
            return 1
        count = torch.cuda.device_count()
        if count == 0:
            raise ValueError(f"trainer.accelerator={accelerator} but no GPU is visible; on a CPU use trainer=cpu")
        return count
    return int(devices)


def gradient_accumulation(global_batch_size: int, micro_batch_size: int, world_size: int) -> int:
    """global = micro x accumulation x devices x nodes; refuse a global batch that this does not give exactly."""
    if global_batch_size < 1 or micro_batch_size < 1:
        raise ValueError(f"data.global_batch_size ({global_batch_size}) and data.micro_batch_size "
                         f"({micro_batch_size}) must be positive")
    per_pass = micro_batch_size * world_size
    if global_batch_size % per_pass != 0:
        raise ValueError(
            f"data.global_batch_size={global_batch_size} is not divisible by micro_batch_size x devices x nodes = "
            f"{micro_batch_size} x {world_size} = {per_pass}: the gradient accumulation "
            f"{global_batch_size}/{per_pass} would not be a whole number. Choose a global batch that is a multiple "
            f"of {per_pass}, or change data.micro_batch_size / trainer.devices / trainer.num_nodes.")
    return global_batch_size // per_pass


def _output_dir(cfg: DictConfig) -> Path:
    try:
        value = cfg.output_dir
    except (InterpolationResolutionError, ValueError) as error:
        raise ValueError("output_dir is not set: `python pipeline/train.py` takes Hydra's run directory; when "
                         "calling train() yourself, pass output_dir=<directory>") from error
    if not value:
        raise ValueError("output_dir is empty")
    return Path(value).resolve()


def _optional_path(cfg: DictConfig, key: str) -> str | None:
    value = cfg.get(key)
    return None if value in (None, "") else str(value)


def _open_shard_set(cfg: DictConfig, model_config: BertConfig):
    from pipeline.data.shard_set import ShardSet

    path, seq = str(cfg.data.path), int(cfg.data.max_seq_length)
    if seq > model_config.max_position_embeddings:
        raise ValueError(f"data.max_seq_length={seq} exceeds the model's max_position_embeddings="
                         f"{model_config.max_position_embeddings}; raise model.max_position_embeddings")
    try:
        # Hash the set before the first step (rank 0: the others would read the same files), so a corrupt shard
        # stops the run now, named, rather than hours in wherever its row group comes.
        verify = bool(cfg.data.get("verify_checksums", True)) and _is_first_process()
        shard_set = ShardSet.open(path, max_seq_length=seq, vocab_size=model_config.vocab_size,
                                  verify_checksums=verify)
    except FileNotFoundError as error:
        hint = ""
        if Path(path).resolve() == SAMPLE_SHARDS.resolve():
            hint = " For the bundled sample, run `python data_prep/run.py` (from the repository root) first."
        raise FileNotFoundError(f"{error}{hint}") from None
    expected = cfg.data.get("max_predictions_per_seq")
    if expected is not None and shard_set.max_predictions_per_seq != int(expected):
        raise ValueError(f"shard set {path} has max_predictions_per_seq={shard_set.max_predictions_per_seq}, but "
                         f"data.max_predictions_per_seq={expected}: these shards were made for another phase; set "
                         f"data.max_predictions_per_seq={shard_set.max_predictions_per_seq} or use the right set")
    return shard_set


def _newest_checkpoint(output_dir: Path) -> str:
    """ckpt_path=last: the newest complete checkpoint of the run in output_dir (a write killed half-way leaves
    only a temporary file, removed here, and the previous checkpoint whole)."""
    from pipeline.checkpoint_files import newest_complete_checkpoint, remove_partial_checkpoints

    if _is_first_process():
        for partial in remove_partial_checkpoints(output_dir / CHECKPOINT_DIR, output_dir):
            log.info("removed %s, left by an interrupted checkpoint write", partial)
    newest = newest_complete_checkpoint(output_dir / CHECKPOINT_DIR, output_dir)
    if newest is None:
        raise FileNotFoundError(f"ckpt_path=last: no complete checkpoint in {output_dir / CHECKPOINT_DIR} (pass the "
                                "run's output_dir=..., or start without ckpt_path)")
    log.info("resuming from %s, the newest complete checkpoint", newest)
    return str(newest)


def _is_first_process() -> bool:
    """Global rank 0 as the launchers say it before the Trainer exists (SLURM, torchrun, Lightning's own)."""
    return all(os.environ.get(name, "0") == "0" for name in ("RANK", "SLURM_PROCID", "NODE_RANK", "LOCAL_RANK"))


def _check_strategy_and_optimizer(cfg: DictConfig) -> None:
    strategy = cfg.get("strategy") or {}
    if strategy.get("name") != "deepspeed":
        return
    stage = int((strategy.get("zero_optimization") or {}).get("stage", 0))
    if cfg.optimizer.name in ("lamb", "fused_lamb") and stage >= 1:
        raise ValueError(
            f"optimizer={cfg.optimizer.name} with DeepSpeed ZeRO stage {stage}: ZeRO hands the optimizer flattened "
            "partitions of many tensors, so LAMB's per-tensor trust ratio would be computed over arbitrary slices "
            "(DeepSpeed lists no LAMB among its ZeRO-supported optimizers). Use strategy=ddp with LAMB "
            "(BERT-large's optimizer state fits any modern GPU), or optimizer=adamw with DeepSpeed.")
    if strategy.get("optimizer_in_ds_config", True) and float(cfg.scheduler.get("power", 1.0)) != 1.0:
        raise ValueError(
            f"scheduler.power={cfg.scheduler.power}: with strategy.optimizer_in_ds_config=true the schedule is "
            "DeepSpeed's WarmupDecayLR, which decays linearly only; set strategy.optimizer_in_ds_config=false to use "
            "this pipeline's optimizer and schedule (pipeline/optim.py), or scheduler.power=1.0")


class _Plan:
    """Everything validated before training starts."""

    def __init__(self, cfg: DictConfig):
        self.output_dir = _output_dir(cfg)
        self.model_config = model_config_of(cfg)
        self.trainer_cfg: dict[str, Any] = OmegaConf.to_container(cfg.trainer, resolve=True)
        for key in _DERIVED_TRAINER_KEYS:
            if key in self.trainer_cfg:
                raise ValueError(f"trainer.{key} is set by train() (accumulate_grad_batches from "
                                 "data.global_batch_size, strategy from the strategy group); remove it")
        self.world_size = devices_per_node(self.trainer_cfg) * int(self.trainer_cfg.get("num_nodes", 1))
        self.micro_batch_size = int(cfg.data.micro_batch_size)
        self.accumulation = gradient_accumulation(int(cfg.data.global_batch_size), self.micro_batch_size,
                                                  self.world_size)
        self.max_steps = int(self.trainer_cfg.get("max_steps", -1))
        if self.max_steps < 1 and not self.trainer_cfg.get("fast_dev_run"):
            raise ValueError(f"trainer.max_steps must be positive (training is bounded by optimizer steps), "
                             f"got {self.max_steps}")
        self.schedule_steps = int(cfg.scheduler.get("total_steps") or max(self.max_steps, 1))
        self.warmup_steps = warmup_steps_of(cfg.scheduler, self.schedule_steps)
        _check_strategy_and_optimizer(cfg)
        self.ckpt_path = _optional_path(cfg, "ckpt_path")
        if self.ckpt_path == "last":
            self.ckpt_path = _newest_checkpoint(self.output_dir)
        if self.ckpt_path is not None and not Path(self.ckpt_path).exists():
            raise FileNotFoundError(f"ckpt_path={self.ckpt_path} does not exist (resume from a run's "
                                    f"{CHECKPOINT_DIR}/last.ckpt or {CHECKPOINT_DIR}/step*.ckpt)")
        self.init_from = _optional_path(cfg, "init_from_checkpoint")
        if self.init_from is None and self.ckpt_path is None and cfg.get("require_init_from_checkpoint"):
            raise ValueError("this experiment starts from the weights of an earlier run (phase 2 from phase 1): "
                             "pass init_from_checkpoint=<phase-1 output_dir>/checkpoints/last.ckpt (a .ckpt file, "
                             "a DeepSpeed checkpoint directory or an hf_export directory)")
        if self.init_from is not None and not Path(self.init_from).exists():
            raise FileNotFoundError(f"init_from_checkpoint={self.init_from} does not exist: phase 2 starts from the "
                                    "weights of a finished phase-1 run (its checkpoints/last.ckpt)")
        check_logger_config(cfg.logger)
        self.shard_set = _open_shard_set(cfg, self.model_config)


# ----------------------------------------------------------------------------------------------------------
# weights

def _strip_prefix(state_dict: dict[str, torch.Tensor], prefix: str = "model.") -> dict[str, torch.Tensor]:
    if any(key.startswith(prefix) for key in state_dict):
        return {key[len(prefix):]: value for key, value in state_dict.items() if key.startswith(prefix)}
    return state_dict


def load_pretrained_weights(model: BertForPreTraining, path: str | os.PathLike) -> None:
    """Weights only, from a Lightning .ckpt file, a DeepSpeed checkpoint directory, or an HF export directory."""
    path = Path(path)
    if path.is_dir() and (path / "model.safetensors").is_file():
        from safetensors.torch import load_file

        from model.hf_conversion import from_hf_state_dict
        loaded = from_hf_state_dict(load_file(str(path / "model.safetensors")), model.config)
        state_dict = loaded.state_dict()
    elif path.is_dir():
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        state_dict = _strip_prefix(get_fp32_state_dict_from_zero_checkpoint(str(path)))
    else:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        state_dict = _strip_prefix(checkpoint.get("state_dict", checkpoint))
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    # The tied decoder weight is the word embedding: present under one name or the other.
    missing = [k for k in missing if k != "mlm_head.decoder.weight"]
    if missing or unexpected:
        raise ValueError(f"{path} does not hold this model's weights: missing {missing[:5]}, unexpected "
                         f"{unexpected[:5]} (model {model.config})")


# ----------------------------------------------------------------------------------------------------------
# training

def _build_callbacks(cfg: DictConfig, checkpoint_dir: Path, progress_bar: bool
                     ) -> tuple[list[pl.Callback], ModelCheckpoint]:
    every = int(cfg.callbacks.checkpoint.get("every_n_train_steps") or 0)
    checkpoint = ModelCheckpoint(
        dirpath=str(checkpoint_dir), filename="step{step:07d}", auto_insert_metric_name=False,
        every_n_train_steps=every, every_n_epochs=0, save_top_k=-1 if every else 0,
        save_last=bool(cfg.callbacks.checkpoint.get("save_last", True)), save_on_train_epoch_end=False,
        enable_version_counter=False,   # a resumed run overwrites last.ckpt (never last-v1.ckpt)
    )
    throughput = cfg.callbacks.get("throughput") or {}
    callbacks: list[pl.Callback] = [
        ThroughputMonitor(log_every_n_steps=int(throughput.get("log_every_n_steps") or 10),
                          peak_flops=throughput.get("peak_flops")),
        checkpoint,
    ]
    if progress_bar:
        callbacks.append(StepProgressBar())
    return callbacks, checkpoint


def _build_strategy(cfg: DictConfig, plan: _Plan):
    try:
        from pipeline.strategies import build_strategy
    except ImportError:  # pragma: no cover - the module is part of this repository
        return "auto"
    optimizer_cfg = {**OmegaConf.to_container(cfg.optimizer, resolve=True),
                     "warmup_steps": plan.warmup_steps, "total_steps": plan.schedule_steps}
    return build_strategy(cfg.strategy, precision=str(plan.trainer_cfg.get("precision", "32-true")),
                          gradient_clip_val=plan.trainer_cfg.get("gradient_clip_val"),
                          micro_batch_size=plan.micro_batch_size, accumulate_grad_batches=plan.accumulation,
                          optimizer_cfg=optimizer_cfg, accelerator=str(plan.trainer_cfg.get("accelerator", "auto")))


def _checkpoint_plugins(strategy) -> list:
    """Atomic checkpoint files (pipeline/checkpoints.py); DeepSpeed writes its own sharded directories."""
    from pytorch_lightning.strategies import DeepSpeedStrategy

    from pipeline.checkpoints import AtomicCheckpointIO
    return [] if isinstance(strategy, DeepSpeedStrategy) else [AtomicCheckpointIO()]


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            pass
    return out


def train(cfg: DictConfig, extra_callbacks: Sequence[pl.Callback] = ()) -> dict[str, Any]:
    """Train as `cfg` says; returns {"metrics", "global_step", "rank", "output_dir", "checkpoints",
    "last_checkpoint", "csv", "plot", "hf_export"} (paths as strings, None for what was not written; csv, plot and
    hf_export on rank 0 only). extra_callbacks: added to the Trainer's (tests use it)."""
    plan = _Plan(cfg)
    output_dir = plan.output_dir
    output_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_dir = output_dir / CHECKPOINT_DIR
    pl.seed_everything(int(cfg.seed), workers=True)

    from pipeline.data.datamodule import PretrainingDataModule

    datamodule = PretrainingDataModule(
        path=str(cfg.data.path), max_seq_length=int(cfg.data.max_seq_length),
        vocab_size=plan.model_config.vocab_size, micro_batch_size=plan.micro_batch_size,
        num_workers=int(cfg.data.get("num_workers", 1)), seed=int(cfg.seed),
        pad_to_multiple_of=int(cfg.data.get("pad_to_multiple_of", 8)))
    module = BertPretrainingModule(
        model_config=plan.model_config.to_dict(), optimizer=OmegaConf.to_container(cfg.optimizer, resolve=True),
        scheduler={**OmegaConf.to_container(cfg.scheduler, resolve=True), "total_steps": plan.schedule_steps},
        max_steps=plan.max_steps, overfit_batches=int(cfg.get("overfit_batches") or 0))
    if plan.init_from is not None and plan.ckpt_path is None:
        load_pretrained_weights(module.model, plan.init_from)
        log.info("initialised the weights from %s (new optimizer and schedule)", plan.init_from)

    run_config = OmegaConf.to_container(cfg, resolve=True)
    callbacks, checkpoint_callback = _build_callbacks(cfg, checkpoint_dir,
                                                      bool(plan.trainer_cfg.get("enable_progress_bar", True)))
    with wandb_environment(output_dir):
        # Resuming: from ckpt_path, or (SLURM requeue) from the hpc_ckpt_*.ckpt Lightning finds in default_root_dir.
        resuming = plan.ckpt_path is not None or any(output_dir.glob("hpc_ckpt_*.ckpt"))
        loggers = build_loggers(cfg.logger, output_dir, run_config=run_config, resume=resuming)
        try:
            strategy = _build_strategy(cfg, plan)
            trainer = pl.Trainer(**plan.trainer_cfg, accumulate_grad_batches=plan.accumulation,
                                 strategy=strategy, logger=loggers, plugins=_checkpoint_plugins(strategy),
                                 callbacks=[*callbacks, *extra_callbacks], default_root_dir=str(output_dir))
            trainer.fit(module, datamodule=datamodule, ckpt_path=plan.ckpt_path)
            last_checkpoint = _save_final_checkpoint(trainer, checkpoint_callback, checkpoint_dir)
        finally:
            finish_wandb(loggers)

    result: dict[str, Any] = {
        "metrics": _floats(trainer.callback_metrics), "global_step": trainer.global_step, "rank": trainer.global_rank,
        "output_dir": str(output_dir), "checkpoints": sorted(str(p) for p in checkpoint_dir.glob("*.ckpt")),
        "last_checkpoint": last_checkpoint, "csv": None, "plot": None, "hf_export": None,
    }
    if not trainer.is_global_zero:
        return result
    csv_path = csv_metrics_path(output_dir)
    if csv_path.is_file():
        result["csv"] = str(csv_path)
        if cfg.export.get("plot", True):
            result["plot"] = str(plot_curves(csv_path, output_dir / PLOT_NAME))
    if cfg.export.get("hf", True) and not trainer.fast_dev_run:
        model = module.model
        if getattr(trainer.strategy, "zero_stage_3", False):   # parameters are partitioned: read the checkpoint
            model = BertForPreTraining(plan.model_config)
            load_pretrained_weights(model, last_checkpoint)
        result["hf_export"] = str(export_model(model, output_dir, cfg.data.path))
    log.info("run finished at step %d: %s", trainer.global_step, output_dir)
    return result


def _save_final_checkpoint(trainer: pl.Trainer, callback: ModelCheckpoint, checkpoint_dir: Path) -> str | None:
    """checkpoints/last.ckpt holds the final state even when max_steps is not a multiple of the save interval."""
    if trainer.fast_dev_run or not callback.save_last:
        return None
    last = checkpoint_dir / "last.ckpt"
    if callback._last_global_step_saved != trainer.global_step or not last.exists():
        trainer.save_checkpoint(str(last))   # collective under DeepSpeed: every rank calls it
    return str(last)


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    result = train(cfg)
    if result["rank"] != 0:
        return
    metrics = result["metrics"]
    summary = ", ".join(f"{k.removeprefix('train/')} {metrics[k]:.4f}" for k in
                        ("train/loss", "train/mlm_acc", "train/nsp_acc") if k in metrics)
    print(f"step {result['global_step']}: {summary}\noutputs in {result['output_dir']}")


if __name__ == "__main__":
    main()
