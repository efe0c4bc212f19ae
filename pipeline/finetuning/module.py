"""FinetuneModule: a task model (model/bert/heads.py) inside Lightning. Task-agnostic: what differs between tasks (the
head, turning logits into predictions, the metric) comes from the task's kind and its Task object.

Logged: train/loss (the mean over the steps since the last log and over the ranks) and train/lr every
trainer.log_every_n_steps steps, read on the host at those steps only (pipeline/core/speed/step_stats.py); after every
validation (each epoch end) <split>/<metric> for each evaluation split (dev, or dev_matched and dev_mismatched for
MNLI) and <split>/loss.
Evaluation and prediction on several ranks: each rank collects its rows' results, rank 0 gathers them, each row
once, in row order (pipeline/finetuning/gather.py), and scores them; the other ranks receive the scores. The last
validation's predictions stay on the module (`evaluations`, on rank 0) for the files finetune() writes;
gather_predictions does the same for trainer.predict's outputs.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch

from model import (
    IGNORE_INDEX,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    ModernBertForMultipleChoice,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
)
from model.architectures import EncoderConfig, config_from_dict, is_modernbert
from model.shared.losses import choice_loss, mean_cross_entropy, regression_loss, span_loss
from pipeline.core.optim.optimizers import build_optimizer, build_scheduler, clips_under_mixed_precision
from pipeline.core.speed.clipping import clip_by_norm, clips_itself
from pipeline.core.speed.step_stats import HostCopy, StatWindow, ends_log_step, sum_over_ranks
from pipeline.finetuning.gather import rows_on_rank_zero
from pipeline.finetuning.tasks import get_task

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


# kind -> (BERT's head, ModernBERT's head): the same forward, outputs and losses (model/bert/heads.py,
# model/modernbert/)
_HEADS = {"multiple_choice": (BertForMultipleChoice, ModernBertForMultipleChoice),
          "span": (BertForQuestionAnswering, ModernBertForQuestionAnswering),
          "token": (BertForTokenClassification, ModernBertForTokenClassification),
          "classification": (BertForSequenceClassification, ModernBertForSequenceClassification),
          "regression": (BertForSequenceClassification, ModernBertForSequenceClassification)}


def build_task_model(config: EncoderConfig, kind: str, num_labels: int) -> torch.nn.Module:
    """The task's head on the config's encoder family."""
    head = _HEADS[kind][1 if is_modernbert(config) else 0]
    if kind in ("multiple_choice", "span"):
        return head(config)
    return head(config, num_labels=1 if kind == "regression" else num_labels)


def predictions_from_logits(kind: str, logits: np.ndarray) -> np.ndarray:
    """Label ids (classification, multiple choice) or scores (regression) from (N, labels) logits."""
    return logits[:, 0] if kind == "regression" else logits.argmax(axis=-1)


@dataclasses.dataclass
class Evaluation:
    """One evaluation of a split. On rank 0 it holds every row, in row order; the other ranks get the metrics and
    the loss only (None elsewhere): files and metrics come from rank 0."""
    split: str
    predictions: np.ndarray | None    # (N,) label ids or scores, row i's at i: sequence tasks
    labels: np.ndarray | None
    metrics: dict[str, float]
    loss: float
    artefacts: dict[str, Any] = dataclasses.field(default_factory=dict)   # span / token tasks: file name -> content


def per_token_kind(kind: str) -> bool:
    """Tasks scored per token (span, token): their outputs are (T, ...) per row, evaluated by the task itself."""
    return kind in ("span", "token")


# The heads' own loss of each kind (model/bert/heads.py), applied to one row at a time by row_loss.
_HEAD_LOSSES = {"classification": choice_loss, "multiple_choice": choice_loss, "regression": regression_loss,
                "span": span_loss, "token": functools.partial(mean_cross_entropy, ignore_index=IGNORE_INDEX)}


def row_loss(kind: str, output: torch.Tensor, label: torch.Tensor) -> tuple[float, int]:
    """One row's part of its split's loss, as (summed loss, count): (its loss, 1), or for NER (its loss summed over
    its labelled tokens, their number). The split's loss, the parts' sum over the counts' sum, is then the mean over
    rows (NER: over labelled tokens), the same whatever the batches and ranks. Per-token rows come cut to their real
    tokens: padding, which differs with the batch, takes no part."""
    loss = float(_HEAD_LOSSES[kind](output.unsqueeze(0), label.unsqueeze(0)))
    if kind == "token":
        count = int((label != IGNORE_INDEX).sum())
        return loss * count, count
    return loss, 1


class FinetuneModule(pl.LightningModule):
    def __init__(self, model_config: dict[str, Any], task: str, optimizer: dict[str, Any], scheduler: dict[str, Any],
                 total_steps: int, eval_splits: list[str], eval_data: dict[str, tuple[Any, Any]] | None = None,
                 task_settings: dict[str, Any] | None = None):
        """model_config: the encoder config's fields (BertConfig's, or ModernBertConfig's with "architecture"; dropout
        as fine-tuning wants it); task: a name of pipeline.finetuning.tasks;
        optimizer / scheduler: configs for pipeline/core/optim/optimizers.py; total_steps: optimizer steps of the whole
        run (where the schedule reaches 0); eval_splits: names of the validation dataloaders, in order;
        eval_data, task_settings: what a per-token task's evaluate() needs besides the outputs, the (examples,
        features) of each evaluation split and the task's settings."""
        super().__init__()
        self.save_hyperparameters(ignore=["eval_data"])
        self.task = get_task(task)
        labels = len(self.task.label_names) if self.task.label_names else 1
        self.model = build_task_model(config_from_dict(model_config), self.task.kind, labels)
        self.eval_splits = list(eval_splits)
        self.eval_data = eval_data or {}
        self.task_settings = task_settings or {}
        self.evaluations: dict[str, Evaluation] = {}
        self._collected: dict[int, tuple[list[int], list[Any]]] = {}   # dataloader -> (rows, results) of this rank
        self._losses = StatWindow()                 # [sum of micro-batch losses, micro-batches] since the last log
        self._losses_copy: HostCopy | None = None
        self._step_lr = float("nan")

    def forward(self, batch: dict[str, torch.Tensor], with_labels: bool = True):
        inputs = {key: batch[key] for key in MODEL_INPUTS}
        return self.model(**inputs, labels=batch["labels"] if with_labels else None)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        out = self(batch)
        self._losses.add(torch.stack([out.loss.detach().float(), torch.ones((), device=out.loss.device)]))
        if ends_log_step(self.trainer):
            self._losses_copy = self._losses.start_copy(sum_over_ranks)
            self._step_lr = self.trainer.optimizers[0].param_groups[0]["lr"]   # the rate this step is taken with
        return out.loss

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val=None,
                                    gradient_clip_algorithm=None) -> None:
        # bf16-mixed and fp32: clipped here, so that torch's fused AdamW may train (pipeline/core/speed/clipping.py)
        if not clips_itself(self.trainer):
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        clip_by_norm(self.model.parameters(), float(gradient_clip_val))

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Host values only: Lightning reads a prog-bar value back at the end of every later batch too.
        if self._losses_copy is None:
            return
        (loss_sum, batches), self._losses_copy = self._losses_copy.wait(), None
        self.log("train/loss", loss_sum / batches.clamp(min=1), on_step=True, on_epoch=False, prog_bar=True,
                 batch_size=len(batch["row"]))
        self.log("train/lr", torch.tensor(self._step_lr), on_step=True,
                 on_epoch=False, batch_size=len(batch["row"]))

    # -- evaluation: every rank collects its rows' results; rank 0 gathers them (pipeline/finetuning/gather.py) ------

    def _collect(self, dataloader_idx: int, rows: torch.Tensor, results: list[Any]) -> None:
        collected_rows, collected = self._collected.setdefault(dataloader_idx, ([], []))
        collected_rows.extend(rows.tolist())
        collected.extend(results)

    def _rows_in_order(self, index: int, split: str) -> list[Any] | None:
        """This split's results from every rank, on rank 0, in row order (None on the other ranks)."""
        loaders = self.trainer.val_dataloaders
        loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
        rows, results = self._collected.get(index, ([], []))
        return rows_on_rank_zero(rows, results, len(loaders[index].dataset), f"{self.task.name} {split}")

    def on_validation_epoch_start(self) -> None:
        self._collected = {}

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        logits = self(batch, with_labels=False).logits.detach().float().cpu()
        labels = batch["labels"].cpu()
        if per_token_kind(self.task.kind):   # (B, T, ...): keep each row's real tokens only
            lengths = batch["attention_mask"].sum(dim=1).cpu().tolist()
            outputs = [logits[i, :n] for i, n in enumerate(lengths)]
            labels = [labels[i, :n] if self.task.kind == "token" else labels[i] for i, n in enumerate(lengths)]
        else:
            outputs = list(logits)
        results = [(output.numpy(), None if per_token_kind(self.task.kind) else label.item(),
                    *row_loss(self.task.kind, output, label)) for output, label in zip(outputs, labels)]
        self._collect(dataloader_idx, batch["row"], results)

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:   # a few batches, not the split: nothing to score
            self._collected = {}
            return
        for index, split in enumerate(self.eval_splits):
            results = self._rows_in_order(index, split)
            evaluation = None if results is None else self._evaluate(split, results)
            metrics, loss = self.trainer.strategy.broadcast(
                None if evaluation is None else (evaluation.metrics, evaluation.loss), src=0)
            self.evaluations[split] = evaluation or Evaluation(split, None, None, metrics, loss)
            # every rank logs the same values (callbacks may monitor them on any rank); "max" of equal values keeps
            # them exact, where a mean over ranks could round
            for name, value in {**metrics, "loss": loss}.items():
                self.log(f"{split}/{name}", float(value), add_dataloader_idx=False, sync_dist=True, reduce_fx="max")
        self._collected = {}

    def _evaluate(self, split: str, results: list[tuple]) -> Evaluation:
        """Metrics (and a per-token task's files) from each row's (output, label, loss sum, loss count)."""
        outputs, labels, loss_sums, loss_counts = zip(*results) if results else ((), (), (), ())
        loss = float(np.sum(loss_sums) / max(1, np.sum(loss_counts)))
        if per_token_kind(self.task.kind):
            examples, features = self.eval_data[split]
            metrics, artefacts = self.task.evaluate(examples, features, list(outputs), self.task_settings)
            return Evaluation(split, None, None, metrics, loss, artefacts)
        predictions = predictions_from_logits(self.task.kind, np.stack(outputs))
        labels = np.asarray(labels)
        return Evaluation(split, predictions, labels, self.task.metrics(predictions, labels), loss)

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0):
        return batch["row"].cpu(), self(batch, with_labels=False).logits.detach().float().cpu()

    def configure_optimizers(self):
        optimizer = build_optimizer(self.model, self.hparams.optimizer,
                                    lightning_clips_amp=clips_under_mixed_precision(self.trainer))
        scheduler = build_scheduler(optimizer, self.hparams.scheduler, self.hparams.total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}


def gather_predictions(batches: list[tuple[torch.Tensor, torch.Tensor]], kind: str, num_rows: int, what: str
                       ) -> np.ndarray | None:
    """trainer.predict's outputs on this rank (predict_step's (rows, logits) per batch) -> on rank 0, the
    predictions of every row of the split from every rank, in row order; None on the other ranks."""
    rows = [row for batch_rows, _ in batches for row in batch_rows.tolist()]
    logits = [row for _, batch_logits in batches for row in batch_logits.numpy()]
    ordered = rows_on_rank_zero(rows, logits, num_rows, what)
    if ordered is None:
        return None
    return predictions_from_logits(kind, np.stack(ordered) if ordered else np.zeros((0, 1), dtype=np.float32))
