"""Held-out validation in pre-training (validation.path): the metrics it logs, that it leaves training untouched, and
that a held-out set of another vocabulary is refused before anything runs."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from data_prep.vocab import parse_vocab, vocab_sha256
from pipeline.core.app import compose
from pipeline.pretraining.run import train


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "csv" / "metrics.csv") as handle:
        return list(csv.DictReader(handle))


def test_held_out_metrics_are_logged_and_training_is_the_same_as_without(small_shards, tiny_overrides, tmp_path):
    plain = train(compose("train", tiny_overrides(small_shards, tmp_path / "plain", 8)))
    validated = train(compose("train", [*tiny_overrides(small_shards, tmp_path / "validated", 8),
                                        f"validation.path={small_shards}", "validation.every_n_steps=4",
                                        "validation.max_batches=3"]))
    rows = _rows(Path(validated["output_dir"]))
    val = [r for r in rows if r.get("val/mlm_acc")]
    assert [int(r["step"]) for r in val] == [3, 7]            # after optimizer steps 4 and 8 (0-based step column)
    for r in val:
        assert 0 < float(r["val/mlm_acc"]) < 1 and 0 < float(r["val/nsp_acc"]) < 1
        assert float(r["val/loss"]) == pytest.approx(float(r["val/mlm_loss"]) + float(r["val/nsp_loss"]), rel=1e-6)
    # Validation draws nothing from the RNG that dropout and the training loader use: the same losses, bit for bit.
    train_losses = [[r["train/loss"] for r in _rows(Path(run["output_dir"])) if r.get("train/loss")]
                    for run in (plain, validated)]
    assert train_losses[0] == train_losses[1] and len(train_losses[0]) == 4


def test_the_same_held_out_batches_at_every_validation(small_shards, tiny_overrides, tmp_path):
    """With the learning rate at 0 the weights never change, so every validation must score exactly the same."""
    result = train(compose("train", [*tiny_overrides(small_shards, tmp_path / "frozen", 6), "optimizer.lr=0",
                                     f"validation.path={small_shards}", "validation.every_n_steps=2",
                                     "validation.max_batches=2"]))
    val = [r for r in _rows(Path(result["output_dir"])) if r.get("val/mlm_acc")]
    assert len(val) == 3
    assert len({(r["val/mlm_loss"], r["val/mlm_acc"], r["val/nsp_loss"]) for r in val}) == 1


def test_a_held_out_set_of_another_vocabulary_is_refused(small_shards, tiny_overrides, tmp_path):
    other = tmp_path / "other_vocab"
    shutil.copytree(small_shards, other)
    tokens = parse_vocab((other / "vocab.txt").read_text(encoding="utf-8"))
    a, b = tokens.index("the"), tokens.index("of")
    tokens[a], tokens[b] = tokens[b], tokens[a]        # same size, other ids: a set that fits but means other words
    (other / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["tokenizer"]["vocab_sha256"] = vocab_sha256(tokens)
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="another vocabulary"):
        train(compose("train", [*tiny_overrides(small_shards, tmp_path / "run", 4), f"validation.path={other}"]))
    with pytest.raises(ValueError, match="every_n_steps"):
        train(compose("train", [*tiny_overrides(small_shards, tmp_path / "run", 4), f"validation.path={small_shards}",
                                "validation.every_n_steps=0"]))
