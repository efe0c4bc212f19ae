"""Everything fine-tuning checks before it starts (the task, the files of each split, the weights and the tokenizer
that fits them, the batch for the devices, the sequence length), so that a wrong setting stops the run at once,
saying what to change.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from model.architectures import EncoderConfig, config_from_dict, is_modernbert
from pipeline.core import app
from pipeline.core.checkpoints.weights import load_pretrained
from pipeline.core.devices import world_size
from pipeline.core.run.logger_config import check_logger_config
from pipeline.finetuning.tasks import get_task
from pipeline.finetuning.tasks.hub import looks_like_hub_directory
from pipeline.finetuning.tokenizer import check_special_tokens, load_tokenizer

# finetune.yaml's model.* are BERT's fields (the paper's dropout 0.1). On ModernBERT's layers: hidden_dropout is
# BERT's dropout on the hidden states (after the embeddings, inside each feed-forward block, before the classifier),
# attention_dropout (a field of both) on the attention. ModernBERT's own fields, given too, take precedence.
MODERNBERT_FIELDS_OF = {"hidden_dropout": ("embedding_dropout", "mlp_dropout", "classifier_dropout")}


class FinetuneChecks:
    """Everything validated before fine-tuning starts, and what follows from it."""

    def __init__(self, cfg: DictConfig):
        self.output_dir = app.output_dir(cfg, "finetune")
        self.task = get_task(str(cfg.task.name))
        if not cfg.get("init"):
            raise ValueError("init= is required: the weights to fine-tune (a pre-training run directory, a .ckpt, a "
                             "DeepSpeed checkpoint directory, or a Hugging Face BERT or ModernBERT directory such as "
                             "a downloaded bert-base-uncased)")
        self.trainer_cfg: dict[str, Any] = OmegaConf.to_container(cfg.trainer, resolve=True)
        self.evaluate_only = evaluate_only(cfg)
        self.world_size = world_size(self.trainer_cfg)
        self.sources = preflight(cfg, self.world_size)
        self.batch_size = int(cfg.data.batch_size)
        self.micro_batch_size = self.batch_size // self.world_size

        self.pretrained = load_pretrained(str(cfg.init), cfg.get("tokenizer"))
        overrides = {key: value for key, value in (OmegaConf.to_container(cfg.model, resolve=True) or {}).items()
                     if value is not None}
        self.model_config = fine_tuning_config(self.pretrained.config, overrides)
        self.tokenizer = load_tokenizer(self.pretrained.tokenizer_source, self.model_config.vocab_size)
        check_special_tokens(self.tokenizer, self.model_config)
        self.max_seq_length = int(cfg.data.max_seq_length)
        if self.max_seq_length > self.model_config.max_position_embeddings:
            raise ValueError(f"data.max_seq_length={self.max_seq_length} exceeds the model's "
                             f"max_position_embeddings={self.model_config.max_position_embeddings}")


def fine_tuning_config(config: EncoderConfig, overrides: dict[str, Any]) -> EncoderConfig:
    """The checkpoint's config with finetune.yaml's model.* set over it (for ModernBERT, BERT's dropout keys mapped
    onto its own; a key it has no counterpart for is refused)."""
    fields = config.to_dict()
    if not is_modernbert(config):
        return config_from_dict({**fields, **overrides})
    mapped: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in MODERNBERT_FIELDS_OF:
            mapped.update(dict.fromkeys(MODERNBERT_FIELDS_OF[key], value))
        elif key not in fields:
            known = sorted({*MODERNBERT_FIELDS_OF, *fields} - {"architecture"})
            raise ValueError(f"model.{key} is not a setting of a ModernBERT model (init= holds one); its model.* "
                             f"settings are: {', '.join(known)}")
    own = {key: value for key, value in overrides.items() if key in fields}
    return config_from_dict({**fields, **mapped, **own})


def dropout_settings(config: EncoderConfig) -> dict[str, float]:
    """The dropout a run fine-tuned with, for metrics.json."""
    if not is_modernbert(config):
        return {"hidden_dropout": config.hidden_dropout}
    return {name: getattr(config, name) for name in ("embedding_dropout", "attention_dropout", "mlp_dropout",
                                                     "classifier_dropout")}


def evaluate_only(cfg: DictConfig) -> bool:
    """trainer.max_epochs=0: evaluate (and predict with) the weights of init= as they are; no training data."""
    return cfg.trainer.get("max_epochs") == 0


def preflight(cfg: DictConfig, world_size: int) -> dict[str, str]:
    """What can be checked before the weights exist (the workflow runs it at a stage's declared world size before
    anything is submitted): the task, the files of each split, the global batch over `world_size` processes, the
    logger. Returns the split sources."""
    task = get_task(str(cfg.task.name))
    sources = _split_sources(cfg, task, with_train=not evaluate_only(cfg))
    batch_size = int(cfg.data.batch_size)
    if batch_size < 1 or batch_size % world_size:
        raise ValueError(f"data.batch_size={batch_size} must be a positive multiple of devices x nodes = "
                         f"{world_size} (it is the global batch)")
    check_logger_config(cfg.logger)
    return sources


def _split_sources(cfg: DictConfig, task, with_train: bool = True) -> dict[str, str]:
    """split -> what task.read() reads it from: data.<split> where given (a file, a directory, a hub dataset name),
    else the split's file in data.dir (under any name the task is distributed with), else data.dir itself when it
    is a hub dataset (a local copy in hub layout, or a name). Training (unless `with_train` is False) and evaluation
    data must be there; test splits are used where they are."""
    data_dir = cfg.data.get("dir")
    sources: dict[str, str] = {}
    for split in (*(("train",) if with_train else ()), *task.eval_splits, *task.test_splits):
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
                                 f"{task.expected_files()}")
            continue
        directory = Path(str(data_dir)).expanduser()
        if directory.is_dir():
            found = task.split_file(split, directory)
            hub = getattr(task, "hub", None)
            if found is not None:
                sources[split] = str(found)
            elif required and hub is not None and looks_like_hub_directory(directory, hub.splits[split][0]):
                sources[split] = str(directory)
            elif required:
                raise FileNotFoundError(f"{split} data of task {task.name} not found in {directory}. "
                                        f"{task.expected_files()}")
        elif _is_local_path(str(data_dir)):
            raise FileNotFoundError(f"data.dir={data_dir} does not exist")
        elif required:
            sources[split] = str(data_dir)   # a hub dataset name: read() loads it (online) or says what is wrong
    return sources


def _is_local_path(value: str) -> bool:
    """A path rather than a hub dataset name ("nyu-mll/glue")."""
    return value.startswith(("/", ".", "~")) or Path(value).expanduser().exists()
