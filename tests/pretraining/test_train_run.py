"""A short real CPU run: tiny BERT, 10 optimizer steps on real shards; what it leaves behind."""
from __future__ import annotations

import csv

import pytest
import pytorch_lightning as pl
import torch

from pipeline.core.app import compose
from pipeline.core.checkpoints.weights import load_pretraining_weights
from pipeline.pretraining.module import RNG_KEY
from pipeline.pretraining.run import train

METRICS = ("train/loss", "train/mlm_loss", "train/nsp_loss", "train/mlm_acc", "train/nsp_acc", "train/lr",
           "train/grad_norm", "perf/tokens_per_s", "perf/padded_tokens_per_s", "perf/sequences_per_s", "perf/mfu")


@pytest.fixture(scope="module")
def short_run(small_shards, tmp_path_factory, tiny_overrides):
    out = tmp_path_factory.mktemp("run") / "out"
    result = train(compose("train", tiny_overrides(small_shards, out, 10, "callbacks.throughput.peak_flops=1e12")))
    return result, out


def test_returns_final_metrics_and_paths(short_run):
    result, out = short_run
    assert result["global_step"] == 10 and result["output_dir"] == str(out)
    for key in ("train/loss", "train/mlm_acc", "train/nsp_acc"):
        assert key in result["metrics"]
    assert 0 < result["metrics"]["train/loss"] < 20


def test_checkpoints_periodic_and_last(short_run):
    result, out = short_run
    names = sorted(p.name for p in (out / "checkpoints").glob("*.ckpt"))
    assert names == ["last.ckpt", "step0000005.ckpt", "step0000010.ckpt"]
    assert result["last_checkpoint"] == str(out / "checkpoints" / "last.ckpt")
    checkpoint = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 10
    assert {"torch", "numpy", "python"} <= set(checkpoint[RNG_KEY][0])   # rank 0's (the only rank) RNG states
    assert "PretrainingDataModule" in checkpoint   # the data position, for an exact resume


def test_csv_log_has_every_metric(short_run):
    result, out = short_run
    with open(result["csv"], newline="") as handle:
        rows = list(csv.DictReader(handle))
    logged = {column for row in rows for column, value in row.items() if value}
    assert set(METRICS) <= logged
    steps = sorted({int(row["step"]) for row in rows if row.get("train/loss")})
    assert steps == [1, 3, 5, 7, 9]   # every 2 steps (Lightning's step index: steps done before the logged one)
    accuracy = [float(row["train/mlm_acc"]) for row in rows if row.get("train/mlm_acc")]
    assert all(0.0 <= a <= 1.0 for a in accuracy)
    lrs = [float(row["train/lr"]) for row in rows if row.get("train/lr")]
    # warmup over 2 steps (0, 0.5e-3), then linear decay from 1e-3 to 0 at step 10; logged: steps 1, 3, 5, 7, 9
    assert lrs == pytest.approx([0.5e-3, 1e-3 * 7 / 8, 1e-3 * 5 / 8, 1e-3 * 3 / 8, 1e-3 * 1 / 8])


def test_throughput_and_mfu_are_consistent(short_run):
    from model import BertConfig, flops_per_token
    result, _ = short_run
    with open(result["csv"], newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("perf/mfu")]
    assert len(rows) == 5
    per_token = flops_per_token(BertConfig.from_preset("tiny"), 128, 20)   # most batches are full 128-token rows
    for row in rows:
        padded, tokens = float(row["perf/padded_tokens_per_s"]), float(row["perf/tokens_per_s"])
        assert 0 < tokens <= padded
        assert float(row["perf/sequences_per_s"]) == pytest.approx(padded / 128, rel=0.1)
        assert float(row["perf/mfu"]) == pytest.approx(per_token * padded / 1e12, rel=0.05)


def test_plot_is_a_png(short_run):
    result, out = short_run
    assert result["plot"] == str(out / "curves.png")
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hf_export_loads_in_transformers_and_matches(short_run, small_shards):
    transformers = pytest.importorskip("transformers")
    result, out = short_run
    export = out / "hf_export"
    assert result["hf_export"] == str(export)
    hf_model = transformers.BertForPreTraining.from_pretrained(export, local_files_only=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(export, local_files_only=True)
    encoded = tokenizer("the ship came into the harbour", "anne elliot was there", return_tensors="pt")

    from model import BertConfig, BertForPreTraining
    ours = BertForPreTraining(BertConfig.from_preset("tiny")).eval()
    load_pretraining_weights(ours, out / "checkpoints" / "last.ckpt")
    with torch.no_grad():
        theirs = hf_model(**encoded)
        mine = ours(encoded["input_ids"], encoded["token_type_ids"], encoded["attention_mask"])
    torch.testing.assert_close(theirs.prediction_logits, mine.mlm_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(theirs.seq_relationship_logits, mine.nsp_logits, rtol=1e-4, atol=1e-4)


def test_weights_load_from_checkpoint_and_export_alike(short_run):
    _, out = short_run
    from model import BertConfig, BertForPreTraining
    from_ckpt, from_hf = (BertForPreTraining(BertConfig.from_preset("tiny")) for _ in range(2))
    load_pretraining_weights(from_ckpt, out / "checkpoints" / "last.ckpt")
    load_pretraining_weights(from_hf, out / "hf_export")
    for (name, a), b in zip(from_ckpt.state_dict().items(), from_hf.state_dict().values()):
        assert torch.equal(a, b), name


def test_phase_2_starts_from_a_hugging_face_directory_holding_only_pytorch_model_bin(short_run, small_shards,
                                                                                      tmp_path, tiny_overrides):
    """A downloaded BERT often comes as config.json + pytorch_model.bin (no safetensors): init_from_checkpoint takes
    it for what it is (it was once taken for a DeepSpeed checkpoint directory) and starts from its weights."""
    from safetensors.torch import load_file

    _, out = short_run
    pickled = tmp_path / "bert_bin"     # what transformers' save_pretrained wrote before safetensors
    pickled.mkdir()
    (pickled / "config.json").write_text((out / "hf_export" / "config.json").read_text())
    torch.save(load_file(out / "hf_export" / "model.safetensors"), pickled / "pytorch_model.bin")

    class WeightsAtStart(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            self.state = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}

    start = WeightsAtStart()
    train(compose("train", tiny_overrides(small_shards, tmp_path / "phase2", 1, f"init_from_checkpoint={pickled}",
                                          "scheduler.warmup_steps=0", "export.hf=false", "export.plot=false")),
          extra_callbacks=[start])
    trained = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert start.state.keys() == {k.removeprefix("model.") for k in trained}
    for name, tensor in start.state.items():
        assert torch.equal(tensor, trained[f"model.{name}"]), name


@pytest.mark.slow
def test_overfit_preset_drives_the_loss_down(small_shards, tmp_path):
    overrides = ["+debug=overfit", f"data.path={small_shards}", f"output_dir={tmp_path / 'out'}",
                 "trainer.max_steps=30", "trainer.log_every_n_steps=5", "scheduler.warmup_steps=5",
                 "data.global_batch_size=8", "data.micro_batch_size=8", "trainer.enable_progress_bar=false",
                 "trainer.enable_model_summary=false", "export.hf=false", "export.plot=false"]
    result = train(compose("train", overrides))
    with open(result["csv"], newline="") as handle:
        losses = [float(row["train/loss"]) for row in csv.DictReader(handle) if row.get("train/loss")]
    assert losses[-1] < 0.5 * losses[0] and result["metrics"]["train/nsp_acc"] == 1.0
