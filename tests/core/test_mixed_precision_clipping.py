"""bf16-mixed with gradient clipping trains: Lightning clips the gradients itself under its mixed-precision plugin and
refuses, at the first step, any optimizer that unscales them in its own step, which torch's fused AdamW (the default
wherever the parameters are) declares. The default now takes the per-tensor kernels there; an explicit fused=true
is refused before training, saying why. Run on the CPU, where autocast has bf16 too."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.app import compose
from pipeline.finetuning.run import finetune
from pipeline.pretraining.run import train

SAMPLE_SST2 = Path(__file__).resolve().parents[2] / "pipeline" / "finetuning" / "sample_data" / "SST-2" / "train.tsv"


def _finetune_overrides(init: Path, tmp_path: Path, *extra: str) -> list[str]:
    return ["task=sst2", f"init={init}", f"output_dir={tmp_path / 'run'}", f"data.train={SAMPLE_SST2}",
            f"data.dev={SAMPLE_SST2}", f"data.cache_dir={tmp_path / 'cache'}", "data.limit_train_examples=32",
            "data.limit_eval_examples=16", "data.batch_size=16", "trainer.max_epochs=1", "trainer.precision=bf16-mixed",
            "trainer.enable_progress_bar=false", "export.hf=false", "export.plot=false", "logger=csv", *extra]


def test_finetuning_in_bf16_mixed_with_clipping_trains(tiny_bert_dir, tmp_path):
    result = finetune(compose("finetune", _finetune_overrides(tiny_bert_dir, tmp_path)))
    assert result is not None and (tmp_path / "run" / "metrics.json").is_file()


def test_pretraining_in_bf16_mixed_with_clipping_trains(small_shards, tiny_overrides, tmp_path):
    result = train(compose("train", [*tiny_overrides(small_shards, tmp_path / "run", 4), "trainer.precision=bf16-mixed"]))
    assert (Path(result["output_dir"]) / "checkpoints" / "last.ckpt").is_file()


def test_an_explicit_fused_adamw_there_is_refused_saying_why(tiny_bert_dir, tmp_path):
    with pytest.raises(ValueError, match="optimizer.fused=true cannot train with trainer.precision=\\*-mixed"):
        finetune(compose("finetune", _finetune_overrides(tiny_bert_dir, tmp_path, "optimizer.fused=true")))
