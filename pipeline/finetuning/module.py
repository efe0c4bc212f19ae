"""FinetuneModule: a task model (model/heads.py) inside Lightning. Task-agnostic: what differs between tasks (the
head, turning logits into predictions, the metric) comes from the task's kind and its Task object.

Logged: train/loss and train/lr every trainer.log_every_n_steps steps; after every validation (each epoch end)
<split>/<metric> for each evaluation split (dev, or dev_matched and dev_mismatched for MNLI) and <split>/loss.
The predictions of the last validation stay on the module (`evaluations`) for the files finetune() writes.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch

from model import BertConfig
from pipeline.core.optim import build_optimizer, build_scheduler
from pipeline.finetuning.tasks import get_task

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


def build_task_model(config: BertConfig, kind: str, num_labels: int) -> torch.nn.Module:
    import model

    if kind == "multiple_choice":
        return model.BertForMultipleChoice(config)
    if kind == "span":
        return model.BertForQuestionAnswering(config)
    if kind == "token":
        return model.BertForTokenClassification(config, num_labels=num_labels)
    from model import BertForSequenceClassification

    if kind == "regression":
        return BertForSequenceClassification(config, num_labels=1)
    return BertForSequenceClassification(config, num_labels=num_labels)


def predictions_from_logits(kind: str, logits: np.ndarray) -> np.ndarray:
    """Label ids (classification, multiple choice) or scores (regression) from (N, labels) logits."""
    return logits[:, 0] if kind == "regression" else logits.argmax(axis=-1)


@dataclasses.dataclass
class Evaluation:
    split: str
    rows: np.ndarray                  # positions in the split's features, ascending
    predictions: np.ndarray | None    # (N,) label ids or scores: sequence tasks
    labels: np.ndarray | None
    metrics: dict[str, float]
    artefacts: dict[str, Any] = dataclasses.field(default_factory=dict)   # span / token tasks: file name -> content


def per_token_kind(kind: str) -> bool:
    """Tasks scored per token (span, token): their outputs are (T, ...) per row, evaluated by the task itself."""
    return kind in ("span", "token")


class FinetuneModule(pl.LightningModule):
    def __init__(self, model_config: dict[str, Any], task: str, optimizer: dict[str, Any], scheduler: dict[str, Any],
                 total_steps: int, eval_splits: list[str]):
        """model_config: BertConfig fields (dropout as fine-tuning wants it); task: a name of pipeline.finetuning.tasks;
        optimizer / scheduler: configs for pipeline/core/optim.py; total_steps: optimizer steps of the whole run (where
        the schedule reaches 0); eval_splits: names of the validation dataloaders, in order."""
        super().__init__()
        self.save_hyperparameters()
        self.task = get_task(task)
        labels = len(self.task.label_names) if self.task.label_names else 1
        self.model = build_task_model(BertConfig(**model_config), self.task.kind, labels)
        self.eval_splits = list(eval_splits)
        self.evaluations: dict[str, Evaluation] = {}
        self._collected: dict[int, list[tuple]] = {}
        # span / token tasks: split -> (rows as read, features), and the task's settings; set by attach_eval_data
        self.eval_data: dict[str, tuple[Any, Any]] = {}
        self.task_settings: dict[str, Any] = {}

    def attach_eval_data(self, eval_data: dict[str, tuple[Any, Any]], settings: dict[str, Any]) -> None:
        """What a per-token task's evaluate() needs besides the outputs: the examples and features of each split."""
        self.eval_data, self.task_settings = eval_data, settings

    def forward(self, batch: dict[str, torch.Tensor], with_labels: bool = True):
        inputs = {key: batch[key] for key in MODEL_INPUTS}
        return self.model(**inputs, labels=batch["labels"] if with_labels else None)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        out = self(batch)
        self.log("train/loss", out.loss.detach(), on_step=True, on_epoch=False, prog_bar=True,
                 batch_size=len(batch["row"]))
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], on_step=True, on_epoch=False,
                 batch_size=len(batch["row"]))
        return out.loss

    # -- evaluation ------------------------------------------------------------------------------------------

    def on_validation_epoch_start(self) -> None:
        self._collected = {}

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        out = self(batch)
        logits = out.logits.detach().float().cpu()
        if per_token_kind(self.task.kind):   # (B, T, ...): keep each row's real tokens only
            lengths = batch["attention_mask"].sum(dim=1).cpu().tolist()
            logits = [logits[i, :n].numpy() for i, n in enumerate(lengths)]
        self._collected.setdefault(dataloader_idx, []).append((batch["row"].cpu(), logits, batch["labels"].cpu()))
        split = self.eval_splits[dataloader_idx]
        self.log(f"{split}/loss", out.loss.detach(), on_step=False, on_epoch=True, add_dataloader_idx=False,
                 batch_size=len(batch["row"]))

    def on_validation_epoch_end(self) -> None:
        for index, parts in sorted(self._collected.items()):
            split = self.eval_splits[index]
            if per_token_kind(self.task.kind):
                rows, outputs = _gather_per_token(parts)
                examples, features = self.eval_data[split]
                metrics, artefacts = self.task.evaluate(examples, features, outputs, self.task_settings)
                self.evaluations[split] = Evaluation(split, rows, None, None, metrics, artefacts)
            else:
                rows, logits, labels = _gather_rows(parts)
                predictions = predictions_from_logits(self.task.kind, logits)
                metrics = self.task.metrics(predictions, labels)
                self.evaluations[split] = Evaluation(split, rows, predictions, labels, metrics)
            if not self.trainer.sanity_checking:
                for name, value in metrics.items():
                    self.log(f"{split}/{name}", float(value), add_dataloader_idx=False, rank_zero_only=True)
        self._collected = {}

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0):
        out = self(batch, with_labels=False)
        return batch["row"].cpu(), out.logits.detach().float().cpu()

    def configure_optimizers(self):
        optimizer = build_optimizer(self.model, self.hparams.optimizer)
        scheduler = build_scheduler(optimizer, self.hparams.scheduler, self.hparams.total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}


def _gather_rows(parts: list[tuple[torch.Tensor, ...]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """This rank's (rows, logits, labels), from every rank under DDP, in row order."""
    rows = torch.cat([p[0] for p in parts])
    logits = torch.cat([p[1] for p in parts])
    labels = torch.cat([p[2] for p in parts])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered: list = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, (rows, logits, labels))
        rows = torch.cat([g[0] for g in gathered])
        logits = torch.cat([g[1] for g in gathered])
        labels = torch.cat([g[2] for g in gathered])
        rows, first = np.unique(rows.numpy(), return_index=True)   # a distributed sampler repeats rows to even out
        return rows, logits.numpy()[first], labels.numpy()[first]
    order = torch.argsort(rows)
    return rows[order].numpy(), logits[order].numpy(), labels[order].numpy()


def _gather_per_token(parts: list[tuple]) -> tuple[np.ndarray, list[np.ndarray]]:
    """(rows ascending, each row's (T_row, ...) outputs in that order), from every rank under DDP."""
    rows = torch.cat([p[0] for p in parts]).tolist()
    outputs = [array for p in parts for array in p[1]]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered: list = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, (rows, outputs))
        rows = [r for g in gathered for r in g[0]]
        outputs = [o for g in gathered for o in g[1]]
    by_row = dict(zip(rows, outputs))   # a distributed sampler repeats rows to even out: keep one
    ordered = sorted(by_row)
    return np.asarray(ordered), [by_row[r] for r in ordered]


def gather_predictions(batches: list[tuple[torch.Tensor, torch.Tensor]], kind: str) -> tuple[np.ndarray, np.ndarray]:
    """trainer.predict's outputs -> (rows ascending, predictions)."""
    rows = torch.cat([b[0] for b in batches])
    logits = torch.cat([b[1] for b in batches])
    order = torch.argsort(rows)
    return rows[order].numpy(), predictions_from_logits(kind, logits[order].numpy())
