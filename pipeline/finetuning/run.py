"""Entry point: fine-tune a BERT checkpoint on a GLUE task, SWAG, SQuAD v1.1 or CoNLL-2003, evaluate, export.

    python pipeline/finetune.py task=sst2 init=<pre-training run dir>       # the bundled SST-2 sample on the CPU
    GLUE_DIR=/data/glue python pipeline/finetune.py task=mnli init=/models/bert-base-uncased trainer.accelerator=gpu
    python pipeline/finetune.py -m task=rte init=... optimizer.lr=5e-5,4e-5,3e-5,2e-5 seed=1,2,3   # the paper's sweep
    python pipeline/finetune.py -m hydra/launcher=submitit_slurm ... # the same sweep as SLURM jobs
    python pipeline/sweep_summary.py outputs/finetune/multirun/<date>/<time>   # best dev score per task

A run leaves in its output directory: metrics.json (dev metrics, data and truncation counts, settings),
predictions/<split>.tsv (dev predictions beside the gold labels; SQuAD's predictions.json / nbest_predictions.json
and NER's CoNLL file under predictions/<split>/), glue_submission/<Task>.tsv (leaderboard files, when the task's
test files are there), csv/metrics.csv and curves.png, hf_export/ (transformers'
BertForSequenceClassification / BertForMultipleChoice with id2label, and the tokenizer), and Hydra's .hydra/.

`finetune(cfg)` is the same run as a function (tests call it). Everything that can be checked is checked before
training: the task, the data files, the weights, that the tokenizer fits the weights, the batch and lengths.
"""
from __future__ import annotations

import inspect
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

from data_prep.known_noise import silence_known_noise  # noqa: E402

silence_known_noise()   # before Lightning's import prints what is known to be harmless

import hydra  # noqa: E402
import pytorch_lightning as pl  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from omegaconf.errors import InterpolationResolutionError  # noqa: E402

from model import BertConfig  # noqa: E402
from pipeline.loggers import build_loggers, check_logger_config, finish_wandb  # noqa: E402
from pipeline.loggers import wandb_environment  # noqa: E402
from pipeline.optim import warmup_steps_of  # noqa: E402

CONFIG_DIR = REPO_ROOT / "conf"
SAMPLE_DATA = REPO_ROOT / "pipeline" / "finetuning" / "sample_data"
log = logging.getLogger("pipeline.finetune")


def _task_data_dir(env_var: str, subdir: str = "", sample: str | None = None) -> str | None:
    """${task_data_dir:GLUE_DIR,SST-2}: $GLUE_DIR/SST-2 where GLUE_DIR is set, else the bundled sample of that task
    (sample_data/<sample or subdir>) if there is one, else null (finetune then says what to pass)."""
    root = os.environ.get(env_var)
    if root:
        return str(Path(root) / subdir)
    bundled = SAMPLE_DATA / (sample or subdir) if (sample or subdir) else None
    return str(bundled) if bundled is not None and bundled.is_dir() else None


for _name, _resolver in (("repo_root", lambda: str(REPO_ROOT)), ("task_data_dir", _task_data_dir)):
    if not OmegaConf.has_resolver(_name):
        OmegaConf.register_new_resolver(_name, _resolver)


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The config `python pipeline/finetune.py <overrides>` would run, without Hydra's run directory (pass
    output_dir=...)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="finetune", overrides=list(overrides))


# ----------------------------------------------------------------------------------------------------------
# the plan: everything validated before training

class _Plan:
    def __init__(self, cfg: DictConfig):
        from pipeline.finetuning.pretrained import load_pretrained
        from pipeline.finetuning.tokenizer import load_tokenizer
        from pipeline.tasks import get_task
        from pipeline.train import devices_per_node

        self.output_dir = _output_dir(cfg)
        self.task = get_task(str(cfg.task.name))
        if not cfg.get("init"):
            raise ValueError("init= is required: the weights to fine-tune (a pre-training run directory, a .ckpt, a "
                             "DeepSpeed checkpoint directory, or a Hugging Face BERT directory such as a downloaded "
                             "bert-base-uncased)")
        self.sources = _split_sources(cfg, self.task)
        self.trainer_cfg: dict[str, Any] = OmegaConf.to_container(cfg.trainer, resolve=True)
        self.world_size = devices_per_node(self.trainer_cfg) * int(self.trainer_cfg.get("num_nodes", 1))
        self.batch_size = int(cfg.data.batch_size)
        if self.batch_size < 1 or self.batch_size % self.world_size:
            raise ValueError(f"data.batch_size={self.batch_size} must be a positive multiple of devices x nodes = "
                             f"{self.world_size} (it is the global batch)")
        self.micro_batch_size = self.batch_size // self.world_size
        check_logger_config(cfg.logger)

        self.pretrained = load_pretrained(str(cfg.init), cfg.get("tokenizer"))
        overrides = {key: value for key, value in (OmegaConf.to_container(cfg.model, resolve=True) or {}).items()
                     if value is not None}
        self.model_config = BertConfig.from_dict({**self.pretrained.config.to_dict(), **overrides})
        self.tokenizer = load_tokenizer(self.pretrained.tokenizer_source, self.model_config.vocab_size)
        self.max_seq_length = int(cfg.data.max_seq_length)
        if self.max_seq_length > self.model_config.max_position_embeddings:
            raise ValueError(f"data.max_seq_length={self.max_seq_length} exceeds the model's "
                             f"max_position_embeddings={self.model_config.max_position_embeddings}")


def _output_dir(cfg: DictConfig) -> Path:
    try:
        value = cfg.output_dir
    except (InterpolationResolutionError, ValueError) as error:
        raise ValueError("output_dir is not set: `python pipeline/finetune.py` takes Hydra's run directory; when "
                         "calling finetune() yourself, pass output_dir=<directory>") from error
    return Path(value).resolve()


def _split_sources(cfg: DictConfig, task) -> dict[str, str]:
    """split -> what task.read() reads it from: data.<split> where given (a file, a directory, a hub dataset name),
    else the split's file in data.dir (under any name the task is distributed with), else data.dir itself when it
    is a hub dataset (a local copy in hub layout, or a name). Training and evaluation data must be there; test
    splits are used where they are."""
    from pipeline.tasks.hub import looks_like_hub_directory

    data_dir = cfg.data.get("dir")
    sources: dict[str, str] = {}
    for split in ("train", *task.eval_splits, *task.test_splits):
        required = split not in task.test_splits
        given = cfg.data.get(split)
        if given:
            if _is_local_path(str(given)) and not Path(str(given)).expanduser().exists():
                raise FileNotFoundError(f"{split} data of task {task.name} not found: {given}")
            sources[split] = str(Path(str(given)).expanduser()) if _is_local_path(str(given)) else str(given)
            continue
        if not data_dir:
            if required:
                raise ValueError(f"task {task.name} has no data: pass data.dir=<the task's folder as distributed>, "
                                 f"data.{split}=<file>, or set GLUE_DIR to the folder holding all GLUE tasks. "
                                 f"{_expected_files(task)}")
            continue
        directory = Path(str(data_dir)).expanduser()
        if directory.is_dir():
            found = _split_file(task, split, directory)
            hub = getattr(task, "hub", None)
            if found is not None:
                sources[split] = str(found)
            elif required and hub is not None and looks_like_hub_directory(directory, hub.splits[split][0]):
                sources[split] = str(directory)
            elif required:
                raise FileNotFoundError(f"{split} data of task {task.name} not found in {directory}. "
                                        f"{_expected_files(task)}")
        elif _is_local_path(str(data_dir)):
            raise FileNotFoundError(f"data.dir={data_dir} does not exist")
        elif required:
            sources[split] = str(data_dir)   # a hub dataset name: read() loads it (online) or says what is wrong
    return sources


def _split_file(task, split: str, directory: Path) -> Path | None:
    if hasattr(task, "split_file"):   # tasks distributed under several file names find their own
        return task.split_file(split, directory)
    path = directory / task.splits[split]
    return path if path.is_file() else None


def _expected_files(task) -> str:
    if hasattr(task, "expected_files"):
        return task.expected_files()
    return f"Expected in the task's folder: {', '.join(f'{split}: {name}' for split, name in task.splits.items())}."


def _is_local_path(value: str) -> bool:
    """A path rather than a hub dataset name ("nyu-mll/glue")."""
    return value.startswith(("/", ".", "~")) or Path(value).expanduser().exists()


# ----------------------------------------------------------------------------------------------------------
# data

def task_settings(cfg: DictConfig) -> dict[str, Any]:
    """The task's own settings (conf/task/: SQuAD's doc stride and answer length, NER's document context, ...) and
    the sequence length, as the task's featurize / evaluate take them."""
    settings = {k: v for k, v in OmegaConf.to_container(cfg.task, resolve=True).items() if k != "name"}
    return {**settings, "max_seq_length": int(cfg.data.max_seq_length)}


def _featurized_splits(cfg: DictConfig, plan: _Plan) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(rows as read, features, report) per split. Sequence tasks share features.featurize; tasks with their own
    features (SQuAD's windows, NER's word alignment) bring a featurize method."""
    from pipeline.finetuning.features import featurize, truncation_report

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


def _pad_multiple(cfg: DictConfig, plan: _Plan) -> int:
    value = cfg.data.get("pad_to_multiple_of")
    if value is not None:
        return int(value)
    return 8 if plan.trainer_cfg.get("accelerator") in ("gpu", "cuda") else 1  # tensor-core shapes; no gain on CPU


# ----------------------------------------------------------------------------------------------------------
# the run

def finetune(cfg: DictConfig, extra_callbacks: Sequence[pl.Callback] = ()) -> dict[str, Any]:
    """Fine-tune as `cfg` says; returns {"metrics" (split -> metric -> value), "score", "output_dir", "files"}."""
    from pipeline.finetuning.batches import FeatureRows, PaddingCollator, eval_loader, train_loader
    from pipeline.finetuning.module import FinetuneModule, per_token_kind
    from pipeline.finetuning.weights import load_into_task_model

    plan = _Plan(cfg)
    output_dir = plan.output_dir
    output_dir.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(int(cfg.seed), workers=True)
    examples, features, data_report = _featurized_splits(cfg, plan)
    rows = {split: FeatureRows(split_features, plan.task.kind) for split, split_features in features.items()}
    collator = PaddingCollator(plan.tokenizer.pad_id, _pad_multiple(cfg, plan))
    num_workers = int(cfg.data.get("num_workers") or 0)
    train_batches = train_loader(rows["train"], plan.micro_batch_size, collator,
                                 bool(cfg.data.get("group_by_length")), int(cfg.seed), num_workers)
    eval_splits = list(plan.task.eval_splits)
    eval_batch = int(cfg.data.get("eval_batch_size") or plan.micro_batch_size)
    eval_batches = [eval_loader(rows[split], eval_batch, collator, num_workers) for split in eval_splits]

    epochs = int(plan.trainer_cfg.get("max_epochs", 3))
    steps_per_epoch = math.ceil(math.ceil(len(rows["train"]) / plan.world_size) / plan.micro_batch_size)
    total_steps = max(1, steps_per_epoch * epochs)
    scheduler_cfg = {**OmegaConf.to_container(cfg.scheduler, resolve=True), "total_steps": total_steps}
    warmup_steps_of(scheduler_cfg, total_steps)   # refuse a bad warmup now, not at the first step
    module = FinetuneModule(model_config=plan.model_config.to_dict(), task=plan.task.name,
                            optimizer=OmegaConf.to_container(cfg.optimizer, resolve=True), scheduler=scheduler_cfg,
                            total_steps=total_steps, eval_splits=eval_splits)
    if per_token_kind(plan.task.kind):
        module.attach_eval_data({split: (examples[split], features[split]) for split in eval_splits},
                                task_settings(cfg))
    loaded = load_into_task_model(module.model, plan.pretrained)
    log.info("weights from %s: %s", plan.pretrained.source, loaded)

    run_config = {**OmegaConf.to_container(cfg, resolve=True), "tokenizer_source": str(plan.tokenizer.source)}
    logger_cfg = _logger_config(cfg)
    with wandb_environment(output_dir):
        loggers = build_loggers(logger_cfg, output_dir, run_config=run_config)
        try:
            trainer = pl.Trainer(**{"logger": loggers, "callbacks": list(extra_callbacks),
                                    "default_root_dir": str(output_dir), "enable_checkpointing": False,
                                    "num_sanity_val_steps": 0, **plan.trainer_cfg})
            started = time.perf_counter()
            trainer.fit(module, train_dataloaders=train_batches, val_dataloaders=eval_batches)
            train_seconds = time.perf_counter() - started
            if not module.evaluations:   # no epoch ran (max_epochs=0): evaluate the weights as they are
                trainer.validate(module, dataloaders=eval_batches, verbose=False)
            test_predictions = _predict_tests(trainer, module, rows, collator, eval_batch, plan)
        finally:
            finish_wandb(loggers)

    result = {"metrics": {split: ev.metrics for split, ev in module.evaluations.items()},
              "output_dir": str(output_dir), "global_step": trainer.global_step, "files": {}}
    main = plan.task.main_metric
    result["score"] = float(module.evaluations[eval_splits[0]].metrics[main])
    if not trainer.is_global_zero:
        return result
    from pipeline.finetuning import outputs

    result["files"] = outputs.write_run_outputs(
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
                                "hidden_dropout": plan.model_config.hidden_dropout},
            "data": data_report, "weights_loaded": loaded, "global_step": trainer.global_step,
            "train_seconds": round(train_seconds, 2),
            "train_examples_per_second": round(len(rows["train"]) * epochs / train_seconds, 1) if epochs else None,
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


def _predict_tests(trainer: pl.Trainer, module, rows, collator, batch_size: int, plan: _Plan
                   ) -> dict[str, tuple[Any, Any]]:
    from pipeline.finetuning.batches import eval_loader
    from pipeline.finetuning.module import gather_predictions

    from pipeline.finetuning.module import per_token_kind

    predictions = {}
    for split in plan.task.test_splits:
        if split in rows and not per_token_kind(plan.task.kind):
            batches = trainer.predict(module, dataloaders=eval_loader(rows[split], batch_size, collator))
            predictions[split] = gather_predictions(batches, plan.task.kind)
    return predictions


@hydra.main(config_path="../conf", config_name="finetune", version_base="1.3")
def main(cfg: DictConfig) -> float:
    result = finetune(cfg)
    metrics = "; ".join(f"{split}: " + ", ".join(f"{k} {v:.4f}" for k, v in values.items())
                        for split, values in result["metrics"].items())
    print(f"{cfg.task.name} after {result['global_step']} steps: {metrics}\noutputs in {result['output_dir']}")
    return result["score"]   # what a Hydra sweeper would optimise


if __name__ == "__main__":
    main()
