"""The throughput callback on a fine-tuning run (benchmarks/gpu_check.py measures fine-tuning with it): a task batch has
no MLM head, so its model FLOPs are the encoder's and the pooler's, not those of a vocabulary projection at every
position."""
from __future__ import annotations

import csv
import os

from model import BertConfig, flops_per_token
from pipeline.core.app import FINETUNE_SAMPLE_DATA, compose
from pipeline.core.run.loggers import csv_metrics_path
from pipeline.core.speed.throughput import ThroughputMonitor
from pipeline.finetuning.run import finetune

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def test_finetuning_mfu_counts_the_encoder_and_pooler_only(tiny_bert_dir, tmp_path):
    out = tmp_path / "run"
    finetune(compose("finetune", [
        "task=sst2", f"init={tiny_bert_dir}", f"data.dir={FINETUNE_SAMPLE_DATA / 'SST-2'}", f"output_dir={out}",
        f"data.cache_dir={tmp_path / 'cache'}", "data.batch_size=8", "data.limit_train_examples=32",
        "data.limit_eval_examples=16", "trainer.max_epochs=1", "trainer.log_every_n_steps=2",
        "trainer.enable_progress_bar=false", "export.hf=false", "export.plot=false", "logger=csv"]),
        extra_callbacks=[ThroughputMonitor(log_every_n_steps=2, peak_flops=1e12)])
    with open(csv_metrics_path(out), newline="") as handle:
        windows = [row for row in csv.DictReader(handle) if row.get("perf/mfu")]
    assert len(windows) == 2   # 4 steps of 8 sentences, a window every 2
    config = BertConfig.from_preset("tiny", max_position_embeddings=128)
    # SST-2 sentences padded to each batch's longest (1 to 128 tokens): a window's FLOPs per padded token are an average
    # of the encoder's and pooler's per-token FLOPs at its batches' lengths; with an MLM head at every position they
    # would be ten times more (tiny, V 30,522)
    encoder_and_pooler = [flops_per_token(config, length, 0) for length in range(1, 129)]
    for row in windows:
        padded = float(row["perf/padded_tokens_per_s"])
        assert 0 < float(row["perf/tokens_per_s"]) <= padded
        per_token = float(row["perf/mfu"]) * 1e12 / padded
        assert min(encoder_and_pooler) * (1 - 1e-6) <= per_token <= max(encoder_and_pooler) * (1 + 1e-6)
        assert per_token < flops_per_token(config, 1, 1) / 5
