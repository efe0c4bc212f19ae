"""data.unpad=true through the real train() on real shards (issue 35, item 8): the collator's token_index reaches the
model in training and validation batches alike; without dropout the run is the padded run up to float rounding, and
with dropout it trains (other masks: model/shared/unpadding.py)."""
from __future__ import annotations

import csv
import math

import pytest
import pytorch_lightning as pl

from pipeline.core.app import compose
from pipeline.pretraining.run import train
from tests.helpers.host_sync import HostSyncGuard

STEPS = 4
NO_DROPOUT = ("model.hidden_dropout=0.0", "model.attention_dropout=0.0")


class RecordBatches(pl.Callback):
    """Each micro-batch's loss, and what the model was given: how many tokens it computed on of how many positions."""

    def __init__(self):
        self.loss_values: list = []   # device tensors: read back after the run, not during it (HostSyncGuard)
        self.train_shapes: list[tuple[int, int]] = []   # (computed tokens N, B * T) per training micro-batch
        self.val_shapes: list[tuple[int, int]] = []

    @staticmethod
    def shape(batch) -> tuple[int, int]:
        positions = batch["input_ids"].numel()
        return len(batch["token_index"]) if "token_index" in batch else positions, positions

    @property
    def losses(self) -> list[float]:
        return [float(loss) for loss in self.loss_values]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.loss_values.append(outputs["loss"].detach().clone())
        self.train_shapes.append(self.shape(batch))

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.val_shapes.append(self.shape(batch))


def run(shards, out, tiny_overrides, *extra: str, guard: HostSyncGuard | None = None) -> tuple[dict, RecordBatches]:
    record = RecordBatches()
    result = train(compose("train", [*tiny_overrides(shards, out, STEPS), f"validation.path={shards}",
                                     "validation.every_n_steps=2", "validation.max_batches=3", "export.hf=false",
                                     "export.plot=false", "callbacks.checkpoint.every_n_train_steps=0",
                                     "callbacks.throughput.log_every_n_steps=2", *extra]),
                   extra_callbacks=[record, *([guard] if guard else [])])
    return result, record


def logged(result: dict, name: str) -> list[float]:
    with open(result["csv"], newline="") as handle:
        return [float(row[name]) for row in csv.DictReader(handle) if row.get(name)]


@pytest.fixture(scope="module")
def runs(wiki_shards, tmp_path_factory, tiny_overrides):
    """Wikipedia's shards: short articles make short rows, hence padded batches (a book's rows are nearly all full)."""
    root = tmp_path_factory.mktemp("unpadded")
    runs = {name: run(wiki_shards, root / name, tiny_overrides, *extra) for name, extra in {
        "padded": NO_DROPOUT, "unpadded": ("data.unpad=true", *NO_DROPOUT)}.items()}
    guard = HostSyncGuard(log_every_n_steps=2)   # the micro-batches that end no logging step
    runs["unpadded_dropout"] = (*run(wiki_shards, root / "dropout", tiny_overrides, "data.unpad=true", guard=guard),
                                guard)
    return runs


def test_padded_batches_go_unpadded_in_training_and_validation(runs):
    _, padded = runs["padded"]
    _, unpadded = runs["unpadded"]
    assert runs["unpadded_dropout"][1].train_shapes == unpadded.train_shapes
    assert all(n == positions for n, positions in padded.train_shapes + padded.val_shapes)   # no token_index
    for shapes in (unpadded.train_shapes, unpadded.val_shapes):
        assert any(n < positions for n, positions in shapes)          # padding skipped
        assert all(n % 16 == 0 and n <= positions for n, positions in shapes)   # rounded up (collator.py)
    assert len(unpadded.train_shapes) == 2 * STEPS and len(unpadded.val_shapes) == 2 * 3


def test_without_dropout_the_run_is_the_padded_run(runs):
    (padded_result, padded), (unpadded_result, unpadded) = runs["padded"], runs["unpadded"]
    assert unpadded.losses == pytest.approx(padded.losses, rel=1e-5)
    for name in ("val/loss", "val/mlm_acc", "train/loss"):
        assert logged(unpadded_result, name) == pytest.approx(logged(padded_result, name), rel=1e-5), name
    # The throughput callback counts from the mask and the padded shape, as before: the same share of real tokens.
    share = [result["metrics"]["perf/tokens_per_s"] / result["metrics"]["perf/padded_tokens_per_s"]
             for result in (padded_result, unpadded_result)]
    assert share[0] < 1 and share[1] == pytest.approx(share[0], rel=1e-6)


def test_with_dropout_it_trains_without_a_host_round_trip(runs):
    """The indices come with the batch: an unpadded step reads nothing back from the device (helpers/host_sync.py)."""
    result, record, guard = runs["unpadded_dropout"]
    assert result["global_step"] == STEPS
    assert all(math.isfinite(loss) and 0 < loss < 20 for loss in record.losses)
    assert all(math.isfinite(value) for value in logged(result, "val/loss"))
    assert guard.guarded_batches == 6   # 8 micro-batches, less the last of each logging step (2 and 4)
    assert guard.violations == [], "\n".join(f"{v['call']} step {v['step']}: {v['stack']}" for v in guard.violations)
