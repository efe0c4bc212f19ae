"""A fine-tuning run: `finetune(cfg)` fine-tunes the weights of `init=` on a GLUE task, SWAG, SQuAD v1.1 or
CoNLL-2003 (checked first: pipeline/finetuning/checks.py), evaluates, predicts the test splits and writes its
outputs (pipeline/finetuning/outputs.py). `python pipeline/finetune.py` is this function under Hydra. With
trainer.max_epochs=0 it only evaluates and predicts with the weights as they are (a fine-tuned model's hf_export/),
without training data. On several devices every file and metric holds each row once, in input order, as on one.

A run leaves in its output directory: metrics.json (dev metrics, data and truncation counts, settings),
predictions/<split>.tsv (dev predictions beside the gold labels; SQuAD's predictions.json / nbest_predictions.json
and NER's CoNLL file under predictions/<split>/), glue_submission/<Task>.tsv (leaderboard files, when the task's
test files are there), csv/metrics.csv and curves.png, hf_export/ (transformers'
BertForSequenceClassification / BertForMultipleChoice / ... with id2label, and the tokenizer; ModernBert* from a
ModernBERT checkpoint), and Hydra's .hydra/.

`init=` may hold BERT or a ModernBERT-class encoder (pipeline/core/checkpoints/weights.py tells them apart): the task's
head is then that family's (pipeline/finetuning/module.py), with the same features, batches and outputs.
"""
from __future__ import annotations

import inspect
import logging
import math
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from omegaconf import DictConfig, OmegaConf

from pipeline.core.checkpoints.weights import load_into_task_model
from pipeline.core.cluster.run_dir_lock import holds_run_dir
from pipeline.core.cluster.sigterm import HostSigtermAgreement
from pipeline.core.optim.optimizers import warmup_steps_of
from pipeline.core.run.loggers import build_loggers, finish_wandb, wandb_environment
from pipeline.finetuning.batches import FeatureRows, PaddingCollator, eval_loader, train_loader
from pipeline.finetuning.checks import FinetuneChecks, dropout_settings
from pipeline.finetuning.features import featurize, truncation_report
from pipeline.finetuning.module import FinetuneModule, gather_predictions, per_token_kind
from pipeline.finetuning.outputs import write_run_outputs

log = logging.getLogger("pipeline.finetuning")


def task_settings(cfg: DictConfig) -> dict[str, Any]:
    """The task's own settings (conf/training/task/: SQuAD's doc stride and answer length, NER's document context,
    ...) and the sequence length, as the task's featurize / evaluate take them."""
    settings = {k: v for k, v in OmegaConf.to_container(cfg.task, resolve=True).items() if k != "name"}
    return {**settings, "max_seq_length": int(cfg.data.max_seq_length)}


def _featurized_splits(cfg: DictConfig, plan: FinetuneChecks) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(rows as read, features, report) per split. Sequence tasks share features.featurize; tasks with their own
    features (SQuAD's windows, NER's word alignment) bring a featurize method."""
    cache_dir = cfg.data.get("cache_dir")
    settings = task_settings(cfg)
    examples, features, report = {}, {}, {}
    # settings the task's reader takes (CoNLL's IOB scheme) go to it by name
    reader_parameters = inspect.signature(plan.task.read).parameters
    read_settings = {key: value for key, value in settings.items() if key in reader_parameters}
    for split, source in plan.sources.items():
        rows = plan.task.read(split, source, cache_dir=cache_dir, **read_settings)
        limit = cfg.data.get(f"limit_{'train' if split == 'train' else 'eval'}_examples")
        if limit and len(rows) > int(limit):
            rows = rows.select(range(int(limit)))
        examples[split] = rows
        if hasattr(plan.task, "featurize"):
            features[split], counts = plan.task.featurize(rows, plan.tokenizer, settings, training=split == "train")
        else:
            features[split] = featurize(rows, plan.task.kind, plan.tokenizer, plan.max_seq_length,
                                        description=f"{plan.task.name} {split}")
            counts = truncation_report(features[split])
        report[split] = {"source": source, **counts}
        # what was cut, skipped or repaired (truncated sequences, SQuAD's misaligned answers, NER's cut words)
        noteworthy = {key: value for key, value in counts.items()
                      if key not in ("examples", "features", "document_context") and value}
        if noteworthy:
            log.info("%s %s (%d examples): %s", plan.task.name, split, counts.get("examples", len(rows)),
                     ", ".join(f"{key} {value:,}" for key, value in noteworthy.items()))
    return examples, features, report


def _pad_multiple(cfg: DictConfig, plan: FinetuneChecks) -> int:
    value = cfg.data.get("pad_to_multiple_of")
    if value is not None:
        return int(value)
    return 8 if plan.trainer_cfg.get("accelerator") in ("gpu", "cuda") else 1  # tensor-core shapes; no gain on CPU


# ----------------------------------------------------------------------------------------------------------
# the run

@holds_run_dir("finetune")     # one fine-tuning per output directory (pipeline/core/cluster/run_dir_lock.py)
def finetune(cfg: DictConfig, extra_callbacks: Sequence[pl.Callback] = ()) -> dict[str, Any]:
    """Fine-tune as `cfg` says (trainer.max_epochs=0: only evaluate and predict with the weights of init=); returns
    {"metrics" (split -> metric -> value), "score", "output_dir", "files"}."""
    plan = FinetuneChecks(cfg)
    output_dir = plan.output_dir
    output_dir.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(int(cfg.seed), workers=True)
    examples, features, data_report = _featurized_splits(cfg, plan)
    rows = {split: FeatureRows(split_features, plan.task.kind) for split, split_features in features.items()}
    collator = PaddingCollator(plan.tokenizer.pad_id, _pad_multiple(cfg, plan))
    num_workers = int(cfg.data.get("num_workers") or 0)
    eval_splits = list(plan.task.eval_splits)
    # test splits are predicted where given; per-token tasks (SQuAD, NER) have none
    test_splits = [split for split in plan.task.test_splits if split in rows and not per_token_kind(plan.task.kind)]
    eval_batch = int(cfg.data.get("eval_batch_size") or plan.micro_batch_size)
    eval_batches = [eval_loader(rows[split], eval_batch, collator, num_workers) for split in eval_splits]

    epochs = int(plan.trainer_cfg.get("max_epochs", 3))
    train_rows = len(rows["train"]) if "train" in rows else 0
    steps_per_epoch = math.ceil(math.ceil(train_rows / plan.world_size) / plan.micro_batch_size)
    total_steps = max(1, steps_per_epoch * epochs)
    scheduler_cfg = {**OmegaConf.to_container(cfg.scheduler, resolve=True), "total_steps": total_steps}
    warmup_steps_of(scheduler_cfg, total_steps)   # refuse a bad warmup now, not at the first step
    module = FinetuneModule(model_config=plan.model_config.to_dict(), task=plan.task.name,
                            optimizer=OmegaConf.to_container(cfg.optimizer, resolve=True), scheduler=scheduler_cfg,
                            total_steps=total_steps, eval_splits=eval_splits,
                            eval_data=({split: (examples[split], features[split]) for split in eval_splits}
                                       if per_token_kind(plan.task.kind) else None),
                            task_settings=task_settings(cfg))
    loaded = load_into_task_model(module.model, plan.pretrained)
    log.info("weights from %s: %s", plan.pretrained.source, loaded)

    run_config = {**OmegaConf.to_container(cfg, resolve=True), "tokenizer_source": str(plan.tokenizer.source)}
    logger_cfg = _logger_config(cfg)
    with wandb_environment(output_dir), warnings.catch_warnings():
        # Lightning advises one device for trainer.validate because its sampler repeats rows on several; the module
        # counts each row once (pipeline/finetuning/gather.py).
        warnings.filterwarnings("ignore", message=r"Using `DistributedSampler` with the dataloaders")
        loggers = build_loggers(logger_cfg, output_dir, run_config=run_config)
        try:
            trainer = pl.Trainer(**{"logger": loggers, "callbacks": [HostSigtermAgreement(), *extra_callbacks],
                                    "default_root_dir": str(output_dir), "enable_checkpointing": False,
                                    "num_sanity_val_steps": 0, **plan.trainer_cfg})
            started = time.perf_counter()
            if not plan.evaluate_only:
                train_batches = train_loader(rows["train"], plan.micro_batch_size, collator,
                                             bool(cfg.data.get("group_by_length")), int(cfg.seed), num_workers)
                trainer.fit(module, train_dataloaders=train_batches, val_dataloaders=eval_batches)
            train_seconds = time.perf_counter() - started
            if not module.evaluations:   # evaluation only, or no epoch ended: evaluate the weights as they are
                trainer.validate(module, dataloaders=eval_batches, verbose=False)
            test_predictions = {split: gather_predictions(
                trainer.predict(module, dataloaders=eval_loader(rows[split], eval_batch, collator, num_workers)),
                plan.task.kind, len(rows[split]), f"{plan.task.name} {split}") for split in test_splits}
        finally:
            finish_wandb(loggers)

    result = {"metrics": {split: ev.metrics for split, ev in module.evaluations.items()},
              "output_dir": str(output_dir), "global_step": trainer.global_step, "files": {}}
    main = plan.task.main_metric
    result["score"] = float(module.evaluations[eval_splits[0]].metrics[main])
    if not trainer.is_global_zero:
        return result
    result["files"] = write_run_outputs(
        output_dir=output_dir, task=plan.task, evaluations=module.evaluations, split_rows=features,
        test_predictions=test_predictions, model=module.model, tokenizer_source=plan.tokenizer.source,
        export_hf=bool(cfg.export.get("hf", True)), plot=bool(cfg.export.get("plot", True)),
        summary={
            "task": plan.task.name, "init": plan.pretrained.source, "tokenizer": str(plan.tokenizer.source),
            "main_metric": main, "score": result["score"], "metrics": result["metrics"],
            "hyperparameters": {"lr": float(cfg.optimizer.lr), "batch_size": plan.batch_size, "epochs": epochs,
                                "seed": int(cfg.seed), "max_seq_length": plan.max_seq_length,
                                "warmup_fraction": cfg.scheduler.get("warmup_fraction"),
                                "weight_decay": float(cfg.optimizer.get("weight_decay", 0.0)),
                                **dropout_settings(plan.model_config)},
            "data": data_report, "weights_loaded": loaded, "global_step": trainer.global_step,
            "train_seconds": round(train_seconds, 2),
            "train_examples_per_second": round(train_rows * epochs / train_seconds, 1) if epochs else None,
            "wandb_group": logger_cfg.get("group"),
        })
    log.info("%s: dev %s = %.4f; outputs in %s", plan.task.name, main, result["score"], output_dir)
    return result


def _logger_config(cfg: DictConfig) -> dict[str, Any]:
    """The logger config, with the W&B group defaulting to the sweep's directory in a multirun: runs of one sweep
    then share a group on the dashboard."""
    logger_cfg = OmegaConf.to_container(cfg.logger, resolve=True)
    if logger_cfg.get("group") is None:
        try:
            from hydra.core.hydra_config import HydraConfig
            from hydra.types import RunMode

            hydra_cfg = HydraConfig.get()
            if hydra_cfg.mode == RunMode.MULTIRUN:
                sweep = Path(hydra_cfg.sweep.dir)
                logger_cfg["group"] = f"{cfg.task.name}-{sweep.parent.name}-{sweep.name}"
        except ValueError:   # not under Hydra (a test calling finetune() directly)
            pass
    logger_cfg.setdefault("name", None)
    return logger_cfg


def summary(task_name: str, result: dict[str, Any]) -> str:
    """The lines `python pipeline/finetune.py` prints at the end."""
    metrics = "; ".join(f"{split}: " + ", ".join(f"{k} {v:.4f}" for k, v in values.items())
                        for split, values in result["metrics"].items())
    return f"{task_name} after {result['global_step']} steps: {metrics}\noutputs in {result['output_dir']}"
