"""train() refuses bad configurations before it trains anything, with messages that say what to do."""
from __future__ import annotations

import pytest

import pipeline.pretraining.checks as checks_module
from pipeline.core.app import compose
from pipeline.pretraining.run import train


@pytest.fixture
def run_config(small_shards, tmp_path, tiny_overrides):
    def make(*extra: str):
        return compose("train", tiny_overrides(small_shards, tmp_path / "out", 4, *extra))
    return make


def refused(cfg, error, match, tmp_path):
    with pytest.raises(error, match=match):
        train(cfg)
    assert not (tmp_path / "out" / "checkpoints").exists()   # nothing trained


def test_unknown_model(run_config, tmp_path):
    refused(run_config("model.name=huge"), ValueError, r"unknown model 'huge'; known models: tiny, mini", tmp_path)


def test_missing_shards(run_config, tmp_path):
    missing = tmp_path / "no_shards"
    refused(run_config(f"data.path={missing}"), FileNotFoundError, r"no shard set at .*python data_prep/run\.py",
            tmp_path)


def test_missing_sample_shards_say_how_to_make_them(run_config, tmp_path, monkeypatch):
    sample = tmp_path / "outputs" / "shards" / "sample"
    monkeypatch.setattr(checks_module, "SAMPLE_SHARDS", sample)
    refused(run_config(f"data.path={sample}"), FileNotFoundError,
            r"For the bundled sample, run `python data_prep/run\.py`", tmp_path)


def test_sequence_length_mismatch(run_config, tmp_path):
    refused(run_config("data.max_seq_length=512"), ValueError,
            r"prepared with max_seq_length=128, but training is configured for max_seq_length=512", tmp_path)


def test_sequence_longer_than_the_model(run_config, tmp_path):
    refused(run_config("model.max_position_embeddings=64"), ValueError,
            r"data.max_seq_length=128 exceeds the model's max_position_embeddings=64", tmp_path)


def test_vocabulary_mismatch(run_config, tmp_path):
    refused(run_config("model.vocab_size=32000"), ValueError,
            r"vocabulary of 30522 tokens .* the model has vocab_size=32000", tmp_path)


def test_predictions_mismatch(run_config, tmp_path):
    refused(run_config("data.max_predictions_per_seq=80"), ValueError,
            r"max_predictions_per_seq=20, but data.max_predictions_per_seq=80", tmp_path)


def test_indivisible_global_batch(run_config, tmp_path):
    refused(run_config("data.global_batch_size=9", "trainer.devices=2"), ValueError,
            r"global_batch_size=9 does not divide over devices x nodes = 2 processes", tmp_path)


def test_phase2_without_phase1_checkpoint(small_shards, tmp_path, tiny_overrides):
    # bert_base_phase2's own settings on this machine's scale: CPU, no DeepSpeed, the small seq-128 set.
    cpu = ["trainer=cpu", "strategy=auto", "logger=csv", "model=tiny", "data.max_seq_length=128",
           "data.max_predictions_per_seq=20"]
    cfg = compose("train", ["+experiment=bert_base_phase2", *cpu, *tiny_overrides(small_shards, tmp_path / "out", 4)])
    refused(cfg, ValueError, r"starts from the weights of an earlier run .* pass init_from_checkpoint=", tmp_path)
    cfg = compose("train", ["+experiment=bert_base_phase2", *cpu, *tiny_overrides(small_shards, tmp_path / "out", 4),
                          f"init_from_checkpoint={tmp_path / 'nowhere.ckpt'}"])
    refused(cfg, FileNotFoundError, r"init_from_checkpoint=.*nowhere\.ckpt does not exist", tmp_path)


def test_missing_resume_checkpoint(run_config, tmp_path):
    refused(run_config(f"ckpt_path={tmp_path / 'gone.ckpt'}"), FileNotFoundError, r"ckpt_path=.*gone\.ckpt", tmp_path)


def test_wandb_online_needs_the_key_in_the_environment(run_config, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    refused(run_config("logger=wandb"), ValueError, r"logger.mode=online needs .* WANDB_API_KEY", tmp_path)


def test_derived_trainer_keys_are_refused(run_config, tmp_path):
    refused(run_config("+trainer.accumulate_grad_batches=4"), ValueError,
            r"trainer.accumulate_grad_batches is set by train\(\)", tmp_path)


def test_output_dir_is_required_outside_hydra(small_shards):
    cfg = compose("train", [f"data.path={small_shards}"])
    with pytest.raises(ValueError, match="output_dir is not set"):
        train(cfg)
