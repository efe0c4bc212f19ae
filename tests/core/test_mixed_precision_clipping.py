"""Mixed precision with gradient clipping trains, with torch's fused AdamW where it can (issue 35, item 5). Lightning
clips through its mixed-precision plugin and refuses, at the first step, any optimizer that unscales gradients in its
own step, which torch's fused AdamW declares; that guards a GradScaler's scaled gradients (16-mixed). Under bf16-mixed
there is no scaler: the modules clip themselves (pipeline/core/speed/clipping.py) and the default AdamW is the fused
one. Under 16-mixed the default takes the per-tensor kernels, and an explicit fused=true is refused before training,
saying why. Run on the CPU, where autocast has bf16 too."""
from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from pipeline.core.app import compose
from pipeline.finetuning.run import finetune
from pipeline.pretraining.run import train

SAMPLE_SST2 = Path(__file__).resolve().parents[2] / "pipeline" / "finetuning" / "sample_data" / "SST-2" / "train.tsv"


def _finetune_overrides(init: Path, tmp_path: Path, *extra: str) -> list[str]:
    return ["task=sst2", f"init={init}", f"output_dir={tmp_path / 'run'}", f"data.train={SAMPLE_SST2}",
            f"data.dev={SAMPLE_SST2}", f"data.cache_dir={tmp_path / 'cache'}", "data.limit_train_examples=32",
            "data.limit_eval_examples=16", "data.batch_size=16", "trainer.max_epochs=1", "trainer.precision=bf16-mixed",
            "trainer.enable_progress_bar=false", "export.hf=false", "export.plot=false", "logger=csv", *extra]


class RecordClipping(pl.Callback):
    """The optimizer each step is taken with, and the gradients' norm after clipping (what the step applies)."""

    def __init__(self):
        self.fused: list[bool] = []
        self.clipped_norms: list[float] = []

    def on_before_zero_grad(self, trainer, pl_module, optimizer):
        grads = [p.grad for p in pl_module.model.parameters() if p.grad is not None]
        if not grads:
            return   # before the first step
        self.clipped_norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))
        self.fused.append(bool(optimizer.param_groups[0].get("fused")))


def test_finetuning_in_bf16_mixed_with_clipping_trains_with_fused_adamw(tiny_bert_dir, tmp_path):
    record = RecordClipping()
    overrides = _finetune_overrides(tiny_bert_dir, tmp_path, "trainer.gradient_clip_val=0.01")
    result = finetune(compose("finetune", overrides), extra_callbacks=[record])
    assert result is not None and (tmp_path / "run" / "metrics.json").is_file()
    assert record.fused and all(record.fused)
    assert max(record.clipped_norms) <= 0.01 * 1.001    # clipped (unclipped, a fresh head's gradients are far larger)


def test_pretraining_in_bf16_mixed_with_clipping_trains_with_fused_adamw(small_shards, tiny_overrides, tmp_path):
    record = RecordClipping()
    result = train(compose("train", [*tiny_overrides(small_shards, tmp_path / "run", 4), "trainer.precision=bf16-mixed",
                                     "trainer.gradient_clip_val=0.05"]), extra_callbacks=[record])
    assert (Path(result["output_dir"]) / "checkpoints" / "last.ckpt").is_file()
    assert len(record.fused) == 3 and all(record.fused)      # before the zero_grad of steps 1, 2 and 3
    assert max(record.clipped_norms) <= 0.05 * 1.001
    assert result["metrics"]["train/grad_norm"] > 0.05                    # logged: the norm before clipping


def test_16_mixed_keeps_lightnings_clipping_and_refuses_an_explicit_fused_adamw():
    """16-mixed needs CUDA (on the CPU Lightning trains bf16-mixed instead): its plugin is built here with a CPU
    GradScaler, which is what the decision reads."""
    from types import SimpleNamespace

    from pytorch_lightning.plugins.precision import MixedPrecision

    from pipeline.core.optim.optimizers import build_optimizer, clips_under_mixed_precision
    from pipeline.core.speed.clipping import clips_itself

    def trainer(plugin):
        return SimpleNamespace(precision_plugin=plugin, gradient_clip_val=1.0, gradient_clip_algorithm="norm",
                               strategy=None)

    fp16 = trainer(MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu")))
    bf16 = trainer(MixedPrecision("bf16-mixed", "cpu"))
    assert clips_under_mixed_precision(fp16) and not clips_itself(fp16)
    assert not clips_under_mixed_precision(bf16) and clips_itself(bf16)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="optimizer.fused=true cannot train with trainer.precision=16-mixed"):
        build_optimizer(model, {"name": "adamw", "lr": 1e-3, "fused": True}, lightning_clips_amp=True)
    assert not build_optimizer(model, {"name": "adamw", "lr": 1e-3}, lightning_clips_amp=True).defaults["fused"]


def test_gradients_are_zeroed_in_one_multi_tensor_call():
    """Under DDP with bucket views the module zeroes the gradients in place (pipeline/core/speed/clipping.py): one
    _foreach_zero_ for every tensor, where Optimizer.zero_grad(set_to_none=False) zeroes them one kernel at a time
    unless the optimizer was built with foreach=True (LAMB's is not)."""
    from pipeline.core.optim.optimizers import build_optimizer
    from pipeline.core.speed.clipping import zero_gradients

    model = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(5)))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    lamb = build_optimizer(model, {"name": "lamb", "lr": 1e-3})

    def top_level_ops(fn) -> list[str]:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn()
        return [e.name for e in prof.events() if e.name.startswith("aten::")
                and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]

    assert len(top_level_ops(lambda: lamb.zero_grad(set_to_none=False))) == 10     # one per tensor
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    assert top_level_ops(lambda: zero_gradients(model.parameters())) == ["aten::_foreach_zero_"]
    assert all(bool((p.grad == 0).all()) for p in model.parameters())
