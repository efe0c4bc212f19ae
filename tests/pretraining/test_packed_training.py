"""data.packing=true through the real train() on real shards (issue 48, item 4): each micro-batch's sentence pairs
reach the model packed into fewer rows, in training and validation; without dropout the run is the unpacked run up
to float rounding, padded or unpadded; throughput counts pairs, not rows; and the combinations that cannot run are
refused before anything starts."""
from __future__ import annotations

import csv

import pytest
import pytorch_lightning as pl

from pipeline.core.app import compose
from pipeline.pretraining.checks import preflight
from pipeline.pretraining.run import train

STEPS = 4
NO_DROPOUT = ("model.hidden_dropout=0.0", "model.attention_dropout=0.0")


class RecordBatches(pl.Callback):
    """Each micro-batch's loss, rows, pairs (labelled NSP slots), and whether it came in the packed layout."""

    def __init__(self):
        self.loss_values: list = []
        self.train_rows: list[tuple[int, int, bool]] = []   # (rows, pairs, packed layout) per training micro-batch
        self.val_rows: list[tuple[int, int, bool]] = []

    @staticmethod
    def rows(batch) -> tuple[int, int, bool]:
        return (batch["input_ids"].shape[0], int((batch["next_sentence_labels"] != -100).sum()),
                "cls_positions" in batch)

    @property
    def losses(self) -> list[float]:
        return [float(loss) for loss in self.loss_values]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.loss_values.append(outputs["loss"].detach().clone())
        self.train_rows.append(self.rows(batch))

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.val_rows.append(self.rows(batch))


def run(shards, out, tiny_overrides, *extra: str) -> tuple[dict, RecordBatches]:
    record = RecordBatches()
    result = train(compose("train", [*tiny_overrides(shards, out, STEPS), f"validation.path={shards}",
                                     "validation.every_n_steps=2", "validation.max_batches=3", "export.hf=false",
                                     "export.plot=false", "callbacks.checkpoint.every_n_train_steps=0",
                                     "callbacks.throughput.log_every_n_steps=2", *NO_DROPOUT, *extra]),
                   extra_callbacks=[record])
    return result, record


def logged(result: dict, name: str) -> list[float]:
    with open(result["csv"], newline="") as handle:
        return [float(row[name]) for row in csv.DictReader(handle) if row.get(name)]


@pytest.fixture(scope="module")
def runs(wiki_shards, tmp_path_factory, tiny_overrides):
    """Wikipedia's shards: short articles make short pairs, which pack (a book's rows are nearly all full);
    micro-batches of 8 pairs."""
    root = tmp_path_factory.mktemp("packed")
    batch = ("data.micro_batch_size=8",)
    return {name: run(wiki_shards, root / name, tiny_overrides, *batch, *extra) for name, extra in {
        "unpacked": (), "packed": ("data.packing=true",), "packed_unpadded": ("data.packing=true", "data.unpad=true"),
    }.items()}


def test_pairs_go_packed_in_training_and_validation(runs):
    _, unpacked = runs["unpacked"]
    _, packed = runs["packed"]
    assert len(packed.train_rows) == STEPS and len(packed.val_rows) == 2 * 3
    assert all(rows == pairs == 8 and not layout for rows, pairs, layout in unpacked.train_rows + unpacked.val_rows)
    assert all(pairs == 8 and layout for _, pairs, layout in packed.train_rows + packed.val_rows)   # every pair, once
    # fewer rows in training; the 3 validation batches may hold no two pairs short enough to share a row
    assert sum(rows for rows, _, _ in packed.train_rows) < sum(rows for rows, _, _ in unpacked.train_rows)
    assert all(rows <= 8 for rows, _, _ in packed.val_rows)
    assert runs["packed_unpadded"][1].train_rows == packed.train_rows


@pytest.mark.parametrize("name", ["packed", "packed_unpadded"])
def test_without_dropout_the_run_is_the_unpacked_run(runs, name):
    (unpacked_result, unpacked), (packed_result, packed) = runs["unpacked"], runs[name]
    assert packed.losses == pytest.approx(unpacked.losses, rel=1e-5)
    for metric in ("train/loss", "train/mlm_acc", "train/nsp_acc", "val/loss", "val/mlm_acc", "val/nsp_acc"):
        assert logged(packed_result, metric) == pytest.approx(logged(unpacked_result, metric), rel=1e-5), metric
    # Throughput counts pairs, not rows: sequences per real token is the same packed or not.
    per_token = [result["metrics"]["perf/sequences_per_s"] / result["metrics"]["perf/tokens_per_s"]
                 for result in (unpacked_result, packed_result)]
    assert per_token[1] == pytest.approx(per_token[0], rel=1e-6)
    # ... and the padded slots computed fall: packed rows carry less padding
    share = [result["metrics"]["perf/tokens_per_s"] / result["metrics"]["perf/padded_tokens_per_s"]
             for result in (unpacked_result, packed_result)]
    assert share[1] > share[0]


@pytest.mark.parametrize("overrides,refusal", [
    (["model=modernbert_tiny"], "packs BERT's sentence pairs; a ModernBERT model"),
    (["model.compile=true"], "data.packing=true with model.compile=true"),
    (["data.max_pairs_per_row=0"], "data.max_pairs_per_row must be a positive integer"),
])
def test_what_cannot_run_is_refused_before_anything_starts(overrides, refusal, tmp_path):
    base = [f"output_dir={tmp_path}", "trainer.max_steps=4", "scheduler.warmup_steps=2"]
    preflight(compose("train", [*base, *overrides]), world_size=1)   # fine without packing
    with pytest.raises(ValueError, match=refusal):
        preflight(compose("train", [*base, "data.packing=true", *overrides]), world_size=1)


def test_a_set_without_sentence_pairs_is_refused(mlm_only_shards, tmp_path, tiny_overrides):
    with pytest.raises(ValueError, match=r"holds MLM-only rows \(objective=mlm\).*set data.packing=false"):
        train(compose("train", tiny_overrides(mlm_only_shards, tmp_path / "run", 4, "data.packing=true",
                                              "data.max_predictions_per_seq=38")))


@pytest.fixture(scope="module")
def mlm_only_shards(tmp_path_factory, shared_data):
    import shutil

    from data_prep.run import run as prepare
    inputs = tmp_path_factory.mktemp("books")
    shutil.copy(shared_data / "corpora" / "books" / "austen-persuasion.txt", inputs)
    out = tmp_path_factory.mktemp("shards") / "mlm"
    prepare([f"inputs=[{{path: '{inputs}/*.txt', format: books}}]", f"output_dir={out}", "preset=phase1",
             "objective=mlm", "masking=dynamic", "dupe_factor=1", "num_shards=1", "masked_lm_prob=0.3",
             "max_predictions_per_seq=38", "--runner=DirectRunner", "--direct_running_mode=in_memory"])
    return out


@pytest.mark.slow
def test_under_deepspeed_packed_rows_train_as_unpacked(wiki_shards, tmp_path, tiny_overrides, torch_extensions_dir,
                                                       monkeypatch):
    """ZeRO-2 on the CPU, each run a process of its own as users start it: DeepSpeed's engine takes the packed passes'
    varying row counts, and without dropout the logged losses and accuracies are the unpacked run's."""
    from pipeline.core.run.loggers import csv_metrics_path
    from tests.helpers.training import run_training_process

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", torch_extensions_dir)
    deepspeed = ("strategy=deepspeed_stage_2", "optimizer=adamw", "optimizer.lr=1e-4", "data.micro_batch_size=8",
                 "export.hf=false", "export.plot=false", "callbacks.checkpoint.every_n_train_steps=0", *NO_DROPOUT)
    logged_runs = {}
    for name, extra in {"unpacked": (), "packed": ("data.packing=true",)}.items():
        out = tmp_path / name
        done = run_training_process(tiny_overrides(wiki_shards, out, STEPS, *deepspeed, *extra), timeout=600)
        assert done.returncode == 0 and f"FINAL_STEP {STEPS}" in done.stdout, done.stderr[-3000:]
        with open(csv_metrics_path(out), newline="") as handle:
            logged_runs[name] = [row for row in csv.DictReader(handle) if row.get("train/loss")]
    assert len(logged_runs["packed"]) == len(logged_runs["unpacked"]) == STEPS // 2
    for metric in ("train/loss", "train/mlm_acc", "train/nsp_acc"):
        packed = [float(row[metric]) for row in logged_runs["packed"]]
        assert packed == pytest.approx([float(row[metric]) for row in logged_runs["unpacked"]], rel=1e-5), metric
