"""Pre-training a ModernBERT-class encoder through the real train(): packed documents with their boundaries, 30%
online masking, validation, the export that transformers loads as ModernBertForMaskedLM and scores exactly as our
validation did, an exact resume, and the refusals a user meets before anything trains."""
from __future__ import annotations

import csv
import json
import shutil

import pyarrow.parquet as pq
import pytest
import torch

from pipeline.core.app import compose
from pipeline.pretraining.run import train

SEQ, PREDICTIONS = 256, 77   # 30% of 256 tokens, rounded as data prep rounds
MODERN_DATA = ["objective=mlm", "masking=dynamic", "masked_lm_prob=0.3", f"max_seq_length={SEQ}",
               f"max_predictions_per_seq={PREDICTIONS}", "dupe_factor=1", "num_shards=1"]
# local_attention=64: rows of 256 are four windows long, so local and global layers see different keys
MODERN_MODEL = ["model=modernbert_tiny", "model.local_attention=64", f"data.max_seq_length={SEQ}",
                f"data.max_predictions_per_seq={PREDICTIONS}"]


def _prepare(shared_data, tmp_path_factory, book: str, name: str, *extra: str):
    from data_prep.run import run
    inputs = tmp_path_factory.mktemp(f"{name}-books")
    shutil.copy(shared_data / "corpora" / "books" / book, inputs)
    out = tmp_path_factory.mktemp("shards") / name
    run([f"inputs=[{{path: '{inputs}/*.txt', format: books}}]", f"output_dir={out}", "preset=phase1", *MODERN_DATA,
         *extra, "--runner=DirectRunner", "--direct_running_mode=in_memory"])
    return out


@pytest.fixture(scope="module")
def modern_sets(shared_data, tmp_path_factory):
    train_set = _prepare(shared_data, tmp_path_factory, "austen-persuasion.txt", "train")
    held_out = _prepare(shared_data, tmp_path_factory, "chesterton-thursday.txt", "held_out",
                        f"vocab.file={train_set}/vocab.txt")
    return train_set, held_out


@pytest.fixture(scope="module")
def modern_run(modern_sets, tmp_path_factory, tiny_overrides):
    train_set, held_out = modern_sets
    out = tmp_path_factory.mktemp("run") / "out"
    result = train(compose("train", tiny_overrides(train_set, out, 6, *MODERN_MODEL, "data.num_workers=2",
                                                   f"validation.path={held_out}", "validation.every_n_steps=3")))
    return result, out


def test_the_run_trains_exports_and_logs_masked_lm_only(modern_run):
    result, out = modern_run
    assert result["global_step"] == 6
    config = json.loads((out / "hf_export" / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["architectures"] == ["ModernBertForMaskedLM"]
    with open(result["csv"], newline="") as handle:
        columns = set(next(csv.reader(handle)))
    assert {"train/mlm_loss", "train/mlm_acc", "val/mlm_loss", "val/mlm_acc"} <= columns
    assert not any("nsp" in column for column in columns)


def _reference_masks(document_ids: torch.Tensor, half_window: int) -> dict[str, torch.Tensor]:
    """transformers' per-layer-kind boolean masks (B, 1, T, T), written here from the rule, not from our model: a
    token sees the real tokens of its own document, and on sliding layers only those within the half-window.
    Padding (document id -1) sees only padding: no real token reads it, and no row of the softmax is empty (NaN)."""
    same = document_ids[:, :, None] == document_ids[:, None, :]
    positions = torch.arange(document_ids.shape[1])
    near = (positions[:, None] - positions[None, :]).abs() <= half_window
    return {"full_attention": same[:, None], "sliding_attention": (same & near)[:, None]}


def test_transformers_scores_the_export_as_our_validation_did(modern_run, modern_sets):
    """The export, loaded by transformers, gives the held-out MLM loss and accuracy our last validation logged."""
    transformers = pytest.importorskip("transformers")
    from pipeline.pretraining.data.datamodule import PretrainingDataModule

    result, out = modern_run
    train_set, held_out = modern_sets
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out / "hf_export", attn_implementation="sdpa").eval()
    assert type(hf).__name__ == "ModernBertForMaskedLM"
    data = PretrainingDataModule(str(train_set), SEQ, hf.config.vocab_size, micro_batch_size=4, num_workers=0,
                                 seed=1234, val_path=str(held_out), document_layout=True)
    data.setup()
    loss_sum, correct, total = 0.0, 0, 0
    with torch.no_grad():
        for batch in data.val_dataloader():
            masks = _reference_masks(batch["document_ids"], hf.config.local_attention // 2)
            logits = hf(input_ids=batch["input_ids"], attention_mask=masks, position_ids=batch["position_ids"]).logits
            picked = torch.gather(logits, 1, batch["masked_positions"][..., None].expand(-1, -1, logits.shape[-1]))
            labels = batch["masked_lm_labels"]
            counted = labels != -100
            loss_sum += torch.nn.functional.cross_entropy(picked[counted], labels[counted], reduction="sum").item()
            correct += int((picked.argmax(-1) == labels)[counted].sum())
            total += int(counted.sum())
    with open(result["csv"], newline="") as handle:
        logged = [row for row in csv.DictReader(handle) if row.get("val/mlm_acc")][-1]
    assert total > 0
    assert correct / total == pytest.approx(float(logged["val/mlm_acc"]), abs=1e-6)
    assert loss_sum / total == pytest.approx(float(logged["val/mlm_loss"]), rel=1e-5)


def test_a_bert_sentence_pair_set_is_refused_naming_the_data_prep_to_run(small_shards, tmp_path, tiny_overrides):
    cfg = compose("train", tiny_overrides(small_shards, tmp_path / "out", 3, "model=modernbert_tiny"))
    with pytest.raises(ValueError, match="sentence pairs.*objective=mlm"):
        train(cfg)


def test_a_set_without_document_boundaries_is_refused(modern_sets, tmp_path, tiny_overrides):
    """A format-2 MLM set (made before data prep recorded where documents start) trains BERT, not ModernBERT."""
    train_set, _ = modern_sets
    old = tmp_path / "old_mlm"
    shutil.copytree(train_set, old)
    manifest = json.loads((old / "manifest.json").read_text())
    for shard in manifest["shards"]:
        path = old / shard["parquet"]["path"]
        table = pq.read_table(path)
        pq.write_table(table.drop_columns(["document_starts"]), path)
    manifest["format_version"] = 2
    (old / "manifest.json").write_text(json.dumps(manifest))
    cfg = compose("train", tiny_overrides(old, tmp_path / "out", 3, *MODERN_MODEL, "data.verify_checksums=false"))
    with pytest.raises(ValueError, match="records no document boundaries.*objective=mlm"):
        train(cfg)


def test_an_odd_local_window_is_refused_before_anything_trains(modern_sets, tmp_path, tiny_overrides):
    train_set, _ = modern_sets
    cfg = compose("train", tiny_overrides(train_set, tmp_path / "out", 3, *MODERN_MODEL, "model.local_attention=127"))
    with pytest.raises(ValueError, match="local_attention.*even"):
        train(cfg)
    assert not (tmp_path / "out" / "checkpoints").exists()


@pytest.mark.slow
def test_a_resume_continues_the_same_masks_and_losses(modern_sets, modern_run, tmp_path, tiny_overrides):
    """Stopped after step 5 of the same 6-step schedule, resumed with loader workers: the weights after step 6 score
    the held-out set as the uninterrupted run's did, to the bit (the online masks are seeded per row, the loader's
    position and the RNG states restored)."""
    train_set, held_out = modern_sets
    (result, _), out = modern_run, tmp_path / "out"
    overrides = tiny_overrides(train_set, out, 6, *MODERN_MODEL, "data.num_workers=2", "scheduler.total_steps=6",
                               f"validation.path={held_out}", "validation.every_n_steps=3")
    first = train(compose("train", [*overrides, "trainer.max_steps=5"]))
    assert first["global_step"] == 5
    resumed = train(compose("train", [*overrides, "ckpt_path=last", "resume.accept_changes=[trainer.max_steps]"]))
    assert resumed["global_step"] == 6

    def last_validation(csv_path):   # of the weights after step 6: equal only if every step trained alike
        with open(csv_path, newline="") as handle:
            return [row for row in csv.DictReader(handle) if row.get("val/mlm_loss")][-1]

    ours, uninterrupted = last_validation(resumed["csv"]), last_validation(result["csv"])
    assert ours["step"] == uninterrupted["step"]
    assert (ours["val/mlm_loss"], ours["val/mlm_acc"]) == (uninterrupted["val/mlm_loss"], uninterrupted["val/mlm_acc"])


def test_continued_pretraining_refuses_shards_of_another_vocabulary(modern_run, modern_sets, shared_data,
                                                                    tmp_path_factory, tiny_overrides):
    """The same size, two tokens swapped: the shard set's own check (vocab_size) passes, the weights' would not."""
    _, run_dir = modern_run
    tokens = (modern_sets[0] / "vocab.txt").read_text(encoding="utf-8").splitlines()
    tokens[1000], tokens[1001] = tokens[1001], tokens[1000]
    swapped = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    swapped.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    other = _prepare(shared_data, tmp_path_factory, "chesterton-thursday.txt", "other_vocab", f"vocab.file={swapped}")
    out = tmp_path_factory.mktemp("continued") / "out"
    cfg = compose("train", tiny_overrides(other, out, 3, *MODERN_MODEL, f"init_from_checkpoint={run_dir}"))
    with pytest.raises(ValueError, match="made with another vocabulary"):
        train(cfg)


@pytest.mark.slow
def test_two_ranks_resume_bitwise_after_sigkill(modern_sets, tmp_path):
    """2 CPU processes (DDP over gloo, a loader worker each) on packed rows with online masking: killed with SIGKILL
    after the checkpoint of step 2, resumed from it, both ranks' losses of every micro-batch after it equal an
    uninterrupted run's, bit for bit."""
    from tests.helpers.training import run_two_rank_training
    from tests.pretraining.test_train_resume_two_ranks import overrides, records

    train_set, _ = modern_sets
    steps, every = 4, 2

    def settings(output_dir, *extra):
        return overrides(train_set, output_dir, *MODERN_MODEL, f"trainer.max_steps={steps}",
                         f"callbacks.checkpoint.every_n_train_steps={every}", *extra)

    straight_out, resumed_out = tmp_path / "straight_records", tmp_path / "resumed_records"
    straight = run_two_rank_training(tmp_path, straight_out, settings(tmp_path / "straight"))
    assert straight.returncode == 0, straight.stderr[-6000:]
    killed = run_two_rank_training(tmp_path, resumed_out, settings(tmp_path / "resumed"), kill_at_step=every + 1)
    assert killed.returncode != 0, killed.stderr[-6000:]
    checkpoint = tmp_path / "resumed" / "checkpoints" / f"step{every:07d}.ckpt"
    resumed = run_two_rank_training(tmp_path, resumed_out, settings(tmp_path / "resumed", f"ckpt_path={checkpoint}"))
    assert resumed.returncode == 0, resumed.stderr[-6000:]
    for rank in (0, 1):
        _, expected = records(straight_out, rank)
        _, got = records(resumed_out, rank)
        after = sorted(key for key in expected if key[0] >= every)
        assert len(after) == 2 * (steps - every)
        assert [got[key]["loss"] for key in after] == [expected[key]["loss"] for key in after], f"rank {rank}"
