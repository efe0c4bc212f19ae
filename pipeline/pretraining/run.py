"""A pre-training run: `train(cfg)` trains as the config says (checked first: pipeline/pretraining/checks.py) and
returns the final metrics and the paths it wrote. `python pipeline/train.py` is this function under Hydra; tests and
benchmarks call it with a composed config (pipeline.core.app.compose("train", overrides), with output_dir=...).

A run leaves, in its output directory: checkpoints/ (periodic step*.ckpt and last.ckpt), csv/metrics.csv,
curves.png, hf_export/ (transformers-loadable), wandb/ (if enabled) and Hydra's .hydra/ config record.

Under SLURM, the requeue signal (SIGUSR1, before the time limit or a preemption) ends the run at the next optimizer
step with checkpoints/last.ckpt saved and the job requeued (pipeline/core/cluster/requeue.py): train() then returns with
"requeued" set, and pipeline/train.py exits with REQUEUED_EXIT_CODE.
"""
from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.strategies import DeepSpeedStrategy

from model.architectures import is_modernbert, pretraining_model
from pipeline.core.checkpoints.architecture_match import context_extension_changes, describe_changes
from pipeline.core.checkpoints.checkpoint_retention import STEP_FILENAME, Retention
from pipeline.core.checkpoints.lightning_checkpoints import AtomicCheckpointIO, ResumingModelCheckpoint
from pipeline.core.checkpoints.weights import CHECKPOINT_DIR, load_pretrained, load_pretraining_weights
from pipeline.core.cluster.requeue import RequeueOnSignal, RequeueRequest, RequeueRequested, cluster_plugins
from pipeline.core.cluster.sigterm import HostSigtermAgreement
from pipeline.core.run.loggers import build_loggers, csv_metrics_path, finish_wandb, wandb_environment
from pipeline.core.run.progress_bar import StepProgressBar
from pipeline.core.run.rollback import check_rollback
from pipeline.core.run.rollback_callback import MoveLaterCheckpointsAside
from pipeline.core.run.run_record_callback import WriteRunRecord
from pipeline.core.speed.fp8 import apply_fp8, fp8_layers
from pipeline.core.speed.strategies import build_strategy
from pipeline.core.speed.throughput import ThroughputMonitor
from pipeline.pretraining.checks import PretrainChecks, check_init_vocabulary
from pipeline.pretraining.compiled import apply_compile_settings, fixed_width_padding
from pipeline.pretraining.data.datamodule import PretrainingDataModule
from pipeline.pretraining.export import export_model, plot_pretraining_curves
from pipeline.pretraining.module import BertPretrainingModule

log = logging.getLogger("pipeline.pretraining")


def _build_callbacks(cfg: DictConfig, checkpoint_dir: Path, progress_bar: bool
                     ) -> tuple[list[pl.Callback], ModelCheckpoint]:
    every = int(cfg.callbacks.checkpoint.get("every_n_train_steps") or 0)
    checkpoint = ResumingModelCheckpoint(
        dirpath=str(checkpoint_dir), filename=STEP_FILENAME, auto_insert_metric_name=False,
        every_n_train_steps=every, every_n_epochs=0, save_top_k=-1 if every else 0,
        save_last=bool(cfg.callbacks.checkpoint.get("save_last", True)), save_on_train_epoch_end=False,
        enable_version_counter=False,   # a resumed run overwrites last.ckpt (never last-v1.ckpt)
        # the newest keep_last and every keep_every_n_steps-th periodic checkpoint; default: all
        retention=Retention.from_config(cfg.callbacks.checkpoint),
    )
    throughput = cfg.callbacks.get("throughput") or {}
    callbacks: list[pl.Callback] = [
        ThroughputMonitor(log_every_n_steps=int(throughput.get("log_every_n_steps") or 10),
                          peak_flops=throughput.get("peak_flops"), fp8=bool(cfg.model.get("fp8"))),
        checkpoint,
        HostSigtermAgreement(),   # Lightning's per-micro-batch SIGTERM broadcast, on the host at step boundaries
    ]
    if progress_bar:
        callbacks.append(StepProgressBar())
    return callbacks, checkpoint


def _build_strategy(cfg: DictConfig, plan: PretrainChecks):
    return build_strategy(cfg.strategy, precision=str(plan.trainer_cfg.get("precision", "32-true")),
                          gradient_clip_val=plan.trainer_cfg.get("gradient_clip_val"),
                          micro_batch_size=plan.micro_batch_size, accumulate_grad_batches=plan.accumulation,
                          accelerator=str(plan.trainer_cfg.get("accelerator", "auto")), world_size=plan.world_size)


def _checkpoint_plugins(strategy) -> list:
    """Atomic checkpoint files (pipeline/core/checkpoints/lightning_checkpoints.py); DeepSpeed writes its own sharded
    directories."""
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
    "last_checkpoint", "csv", "plot", "hf_export", "requeued"} (paths as strings, None for what was not written;
    csv, plot and hf_export on rank 0 only; requeued: the SLURM job id when the run stopped to be requeued).
    extra_callbacks: added to the Trainer's (tests use it)."""
    from pipeline.core.app import output_dir
    from pipeline.core.cluster.run_dir_lock import hold_run_dir

    plugins = cluster_plugins()
    # Under SLURM the requeue signal is handled from the very start: one arriving during the checks is kept, and
    # acted on at the first step (it would otherwise kill the process, without a checkpoint or a requeue).
    # One trainer per run directory, held before the checks read it or remove a partial checkpoint from it; a run
    # stopped to be requeued keeps it for its job's next start (pipeline/core/cluster/run_dir_lock.py).
    with RequeueRequest() if plugins else contextlib.nullcontext() as requeue_request, \
            hold_run_dir(output_dir(cfg, "train")) as run_dir:
        result = _train(cfg, extra_callbacks, plugins, requeue_request)
        run_dir.keep = bool(result["requeued"])
        return result


def _train(cfg: DictConfig, extra_callbacks: Sequence[pl.Callback], plugins: list,
           requeue_request: RequeueRequest | None) -> dict[str, Any]:
    plan = PretrainChecks(cfg)
    # After the config's check against the record: an earlier step than the run's later checkpoints is refused here,
    # on every rank alike, unless resume.rollback=true (rank 0 moves those aside once training starts: rollback.py)
    rollback = check_rollback(plan.output_dir, plan.ckpt_path, cfg.get("resume"))
    output_dir = plan.output_dir
    output_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_dir = output_dir / CHECKPOINT_DIR
    pl.seed_everything(int(cfg.seed), workers=True)

    datamodule = PretrainingDataModule(
        path=str(cfg.data.path), max_seq_length=int(cfg.data.max_seq_length),
        vocab_size=plan.model_config.vocab_size, micro_batch_size=plan.micro_batch_size,
        num_workers=int(cfg.data.get("num_workers", 1)), seed=int(cfg.seed),
        pad_to_multiple_of=fixed_width_padding(cfg.data, cfg.model),
        val_path=(cfg.get("validation") or {}).get("path"), unpad=bool(cfg.data.get("unpad", False)),
        # ModernBERT attends within each packed document: the batches say where each one is
        document_layout=is_modernbert(plan.model_config), masked_lm_prob=cfg.data.get("masked_lm_prob"),
        batch_warmup=plan.batch_warmup,   # data.batch_warmup: the global batch ramps up (data/batch_warmup.py)
        max_pairs_per_row=plan.max_pairs_per_row)   # data.packing: sentence pairs packed (data/pair_packing.py)
    module = BertPretrainingModule(**plan.module_hyper_parameters)   # what its checkpoints carry, and resumes compare
    if cfg.model.get("fp8"):   # before compile traces the encoder and the optimizer takes its (unchanged) parameters
        apply_fp8(module.model, layers=fp8_layers(cfg.model.fp8))   # refuses a device without FP8 first
    if hasattr(module.model, "mlm_head"):   # BERT's decoder (ModernBERT's vocabulary is a multiple of 64 already)
        module.model.mlm_head.vocab_multiple = int(cfg.model.get("pad_vocab_to_multiple_of") or 1)
    apply_compile_settings(module.model, cfg.model, unpad=bool(cfg.data.get("unpad")))   # in place: names unchanged
    module.compiles_whole_model = bool(cfg.model.get("compile")) and cfg.model.get("compile_scope") == "whole"
    module.replays_cuda_graphs = bool(cfg.model.get("cuda_graphs"))
    if plan.init_from is not None and plan.ckpt_path is None:
        pretrained = load_pretrained(plan.init_from)
        check_init_vocabulary(pretrained.tokenizer_source, plan.shard_set, plan.init_from)
        load_pretraining_weights(module.model, plan.init_from, pretrained)
        log.info("initialised the weights from %s (new optimizer and schedule)", plan.init_from)
        extended = context_extension_changes(module.model.config, pretrained.config)
        if extended:   # ModernBERT's context extension: the same weights, new thetas from the first step
            log.info("context extension from %s: %s", plan.init_from, describe_changes(extended))

    run_config = OmegaConf.to_container(cfg, resolve=True)
    callbacks, checkpoint_callback = _build_callbacks(cfg, checkpoint_dir,
                                                      bool(plan.trainer_cfg.get("enable_progress_bar", True)))
    # First: data.micro_batch_size=auto sizes the pass at setup, before any other hook, loader or strategy reads it
    callbacks.insert(0, plan.micro_batch.callback())
    callbacks.append(WriteRunRecord(plan.run_record))   # the config record, at the step training starts from
    if rollback is not None:
        callbacks.append(MoveLaterCheckpointsAside(rollback))
    if requeue_request is not None:
        callbacks.append(RequeueOnSignal(requeue_request, checkpoint_dir))
    requeued: RequeueRequested | None = None
    last_checkpoint = None
    with wandb_environment(output_dir):
        # Resuming: from ckpt_path (auto: the run's newest complete checkpoint, what every SLURM start passes), or
        # from an hpc_ckpt_*.ckpt that Lightning's own SLURM requeue wrote (earlier versions) in default_root_dir.
        resuming = plan.ckpt_path is not None or any(output_dir.glob("hpc_ckpt_*.ckpt"))
        loggers = build_loggers(cfg.logger, output_dir, run_config=run_config, resume=resuming)
        try:
            strategy = _build_strategy(cfg, plan)
            trainer = pl.Trainer(**plan.trainer_cfg, **plan.validation, accumulate_grad_batches=plan.accumulation,
                                 strategy=strategy, logger=loggers, plugins=[*_checkpoint_plugins(strategy), *plugins],
                                 callbacks=[*callbacks, *extra_callbacks], default_root_dir=str(output_dir))
            try:
                trainer.fit(module, datamodule=datamodule, ckpt_path=plan.ckpt_path)
            except RequeueRequested as stop:
                requeued = stop
            else:
                last_checkpoint = _save_final_checkpoint(trainer, checkpoint_callback, checkpoint_dir)
        except BaseException as stopped:
            # W&B shows a run by its exit code: a stopped or failed one is not "finished" (issue 49, item 1)
            finish_wandb(loggers, exit_code=exit_status_of(stopped))
            raise
        finally:
            finish_wandb(loggers)   # when requeued, RequeueOnSignal finished it already, marked preempted

    result: dict[str, Any] = {
        "metrics": _floats(trainer.callback_metrics), "global_step": trainer.global_step, "rank": trainer.global_rank,
        "output_dir": str(output_dir), "checkpoints": sorted(str(p) for p in checkpoint_dir.glob("*.ckpt")),
        "last_checkpoint": last_checkpoint, "csv": None, "plot": None, "hf_export": None, "requeued": None,
    }
    if requeued is not None:
        if requeued.error:
            raise RuntimeError(f"stopped at step {requeued.global_step} to be requeued, with {requeued.checkpoint} "
                               f"saved, but {requeued.error}. Submit the job again with the same run directory "
                               "(RUN_DIR=...): it resumes from there")
        result["last_checkpoint"], result["requeued"] = str(requeued.checkpoint), requeued.job
        if trainer.is_global_zero:
                log.info("requeued as job %s at step %d: it resumes from %s when it starts again", requeued.job,
                     requeued.global_step, requeued.checkpoint)
        return result
    if not trainer.is_global_zero:
        return result
    csv_path = csv_metrics_path(output_dir)
    if csv_path.is_file():
        result["csv"] = str(csv_path)
        if cfg.export.get("plot", True):
            result["plot"] = str(plot_pretraining_curves(csv_path, output_dir))
    if cfg.export.get("hf", True) and not trainer.fast_dev_run:
        model = module.model
        if isinstance(trainer.strategy, DeepSpeedStrategy):
            # The weights trained are the fp32 master weights in the optimizer's partitions: the module holds bf16
            # copies under DeepSpeed's bf16 mode, and under ZeRO-3 only its partition. zero_to_fp32 consolidates
            # them from the final checkpoint (preflight refuses a DeepSpeed export without one).
            model = pretraining_model(plan.model_config, plan.shard_set.has_next_sentence_labels)
            load_pretraining_weights(model, last_checkpoint)
        result["hf_export"] = str(export_model(model, output_dir, cfg.data.path))
    log.info("run finished at step %d: %s", trainer.global_step, output_dir)
    return result


def exit_status_of(stopped: BaseException) -> int:
    """The exit status pipeline/train.py ends with for what stopped the run: 143 for SIGTERM (Lightning's
    SIGTERMException), 130 for Ctrl-C, a SystemExit's own code, else 1."""
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    if isinstance(stopped, SIGTERMException):
        return 128 + signal.SIGTERM
    if isinstance(stopped, KeyboardInterrupt):
        return 128 + signal.SIGINT
    if isinstance(stopped, SystemExit) and isinstance(stopped.code, int):
        return stopped.code
    return 1


def _save_final_checkpoint(trainer: pl.Trainer, callback: ModelCheckpoint, checkpoint_dir: Path) -> str | None:
    """checkpoints/last.ckpt holds the final state even when max_steps is not a multiple of the save interval."""
    if trainer.fast_dev_run or not callback.save_last:
        return None
    last = checkpoint_dir / "last.ckpt"
    if callback._last_global_step_saved != trainer.global_step or not last.exists():
        trainer.save_checkpoint(str(last))   # collective under DeepSpeed: every rank calls it
    return str(last)


def summary(result: dict[str, Any]) -> str:
    """The lines `python pipeline/train.py` prints at the end."""
    metrics = result["metrics"]
    losses = ", ".join(f"{k.removeprefix('train/')} {metrics[k]:.4f}" for k in
                       ("train/loss", "train/mlm_acc", "train/nsp_acc") if k in metrics)
    return f"step {result['global_step']}: {losses}\noutputs in {result['output_dir']}"
