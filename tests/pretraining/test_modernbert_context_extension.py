"""ModernBERT's context-extension phase through the real data prep and train(), as the README runs it: a phase 1 of
ModernBERT-tiny on packed 512-token rows with RoPE theta 10k on every layer, then +experiment=
modernbert_context_extension from its last.ckpt on packed 8,192-token rows with theta 160k on the global layers. The
long phase starts from exactly phase 1's weights, attends with the new thetas from its first step, exports them; and
a checkpoint of another architecture is refused, naming the field."""
from __future__ import annotations

import json
import resource

import pyarrow.parquet as pq
import pytest
import pytorch_lightning as pl
import torch

import model.modernbert.model as modernbert_model
from pipeline.core.app import compose
from pipeline.pretraining.run import train

LONG_SEQ = 8192
QUIET = ["data.num_workers=0", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false"]


def _prepare(tmp_path_factory, preset: str):
    """A data prep preset as shipped (the bundled sample), into a temporary directory."""
    from data_prep.run import run
    out = tmp_path_factory.mktemp("shards") / preset
    run([f"preset={preset}", f"output_dir={out}", "--runner=DirectRunner", "--direct_running_mode=in_memory"])
    return out


@pytest.fixture(scope="module")
def long_rows(tmp_path_factory):
    return _prepare(tmp_path_factory, "sample_modern_long")


@pytest.fixture(scope="module")
def phase1_run(tmp_path_factory):
    """ModernBERT's phase 1 in small: theta 10k on global layers as on local ones, 1,024 positions at most."""
    shards = _prepare(tmp_path_factory, "sample_modern")
    out = tmp_path_factory.mktemp("phase1") / "out"
    result = train(compose("train", ["model=modernbert_tiny", "data=sample_modern", f"data.path={shards}",
                                     f"output_dir={out}", "model.global_rope_theta=10000.0",
                                     "model.max_position_embeddings=1024", "data.global_batch_size=4",
                                     "data.micro_batch_size=4", "trainer.max_steps=3", "scheduler.warmup_steps=1",
                                     "export.plot=false", *QUIET]))
    assert result["global_step"] == 3
    return out


def test_the_experiment_has_the_recipe_values_and_needs_phase_1_weights():
    from pipeline.pretraining.checks import preflight

    cfg = compose("train", ["+experiment=modernbert_context_extension"])
    shape = preflight(compose("train", ["+experiment=modernbert_context_extension", "init_from_checkpoint=p1.ckpt"]))
    assert (shape.model_config.global_rope_theta, shape.model_config.local_rope_theta) == (160000.0, 10000.0)
    assert (cfg.data.max_seq_length, cfg.data.max_predictions_per_seq, cfg.optimizer.lr) == (LONG_SEQ, 2458, 3e-4)
    assert (cfg.optimizer.name, cfg.scheduler.name) == ("stable_adamw", "warmup_stable_decay")
    with pytest.raises(ValueError, match="pass init_from_checkpoint="):
        preflight(cfg)


def test_the_long_presets_make_8192_token_rows_masked_30_percent():
    from data_prep.presets import PRESET_DIR, compose_config

    for preset in ("sample_modern_long", "modern_long"):
        cfg = compose_config(PRESET_DIR, preset)
        assert (cfg.objective, cfg.masking, cfg.masked_lm_prob) == ("mlm", "dynamic", 0.3)
        assert (cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.dupe_factor) == (LONG_SEQ, 2458, 1)


def test_the_long_preset_packs_full_8192_token_rows(long_rows):
    manifest = json.loads((long_rows / "manifest.json").read_text())
    lengths = [len(ids) for shard in manifest["shards"]
               for ids in pq.read_table(long_rows / shard["parquet"]["path"], columns=["input_ids"])
               .column("input_ids").to_pylist()]
    assert lengths and set(lengths) == {LONG_SEQ}
    assert (manifest["parameters"]["max_seq_length"], manifest["parameters"]["max_predictions_per_seq"]) == (
        LONG_SEQ, round(LONG_SEQ * 0.3))
    print(f"sample_modern_long: {len(lengths)} rows of {LONG_SEQ} tokens in {len(manifest['shards'])} shards")


class FirstStepWeights(pl.Callback):
    """The weights the first optimizer step starts from."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 0 and batch_idx == 0:
            self.state = {name: tensor.detach().clone() for name, tensor in pl_module.model.state_dict().items()}
            self.input_length = batch["input_ids"].shape[1]


def _extend(phase1_run, long_rows, out, *extra):
    return compose("train", ["+experiment=modernbert_context_extension",
                             f"init_from_checkpoint={phase1_run}/checkpoints/last.ckpt", f"data.path={long_rows}",
                             f"output_dir={out}", "trainer.max_steps=2", "scheduler.warmup_steps=1",
                             "model.attention_backend=sdpa",
                             "callbacks.checkpoint.every_n_train_steps=0", "export.plot=false", *QUIET, *extra])


@pytest.mark.slow
def test_the_long_phase_starts_from_phase_1_weights_with_the_new_thetas(phase1_run, long_rows, tmp_path,
                                                                        monkeypatch):
    thetas_used: list[tuple[float, int]] = []

    def recording_rotary(positions, head_size, theta, dtype):   # the angles every forward attends with
        thetas_used.append((theta, positions.shape[-1]))
        return rotary_cos_sin(positions, head_size, theta, dtype)

    rotary_cos_sin = modernbert_model.rotary_cos_sin
    monkeypatch.setattr(modernbert_model, "rotary_cos_sin", recording_rotary)
    first = FirstStepWeights()
    result = train(_extend(phase1_run, long_rows, tmp_path / "long"), extra_callbacks=[first])
    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"context extension: peak RSS of the test process {peak_rss_gb:.2f} GB")

    assert result["global_step"] == 2
    assert first.input_length == LONG_SEQ
    phase1 = torch.load(phase1_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    phase1_weights = {name.removeprefix("model."): tensor for name, tensor in phase1["state_dict"].items()}
    assert phase1_weights.keys() == first.state.keys()
    for name, tensor in first.state.items():
        assert torch.equal(tensor, phase1_weights[name]), name
    assert phase1["hyper_parameters"]["model_config"]["global_rope_theta"] == 10000.0

    assert set(thetas_used) == {(160000.0, LONG_SEQ), (10000.0, LONG_SEQ)}   # global layers and local ones
    long = torch.load(result["last_checkpoint"], map_location="cpu", weights_only=True)["hyper_parameters"]
    assert (long["model_config"]["global_rope_theta"], long["model_config"]["local_rope_theta"]) == (160000.0, 10000.0)
    assert long["optimizer"]["lr"] == 3.0e-4

    exported = json.loads((tmp_path / "long" / "hf_export" / "config.json").read_text())
    assert exported["max_position_embeddings"] == LONG_SEQ
    assert (exported["global_rope_theta"], exported["local_rope_theta"]) == (160000.0, 10000.0)
    transformers = pytest.importorskip("transformers")
    loaded = transformers.AutoConfig.from_pretrained(tmp_path / "long" / "hf_export")
    assert loaded.rope_parameters["full_attention"]["rope_theta"] == 160000.0
    assert loaded.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0


@pytest.mark.slow
def test_a_checkpoint_of_another_hidden_size_is_refused_naming_the_field(phase1_run, long_rows, tmp_path):
    out = tmp_path / "long"
    with pytest.raises(ValueError, match=r"holds a ModernBERT of another architecture: hidden_size=128 in the "
                                         r"checkpoint, 256 in this run.*may change only max_position_embeddings, "
                                         r"global_rope_theta, local_rope_theta"):
        train(_extend(phase1_run, long_rows, out, "+model.hidden_size=256"))
    assert not (out / "checkpoints").exists()
