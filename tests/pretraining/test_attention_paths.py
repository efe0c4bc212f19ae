"""The fast attention paths change no loss (issue 21, item 7): a batch without padding goes without an attention mask
(so that SDPA may take its flash kernel), and model.compile=true runs the whole model through torch.compile, on
batches padded to max_seq_length (padding that is masked changes no loss). The real
train() on real shards, micro-batch by micro-batch, against the same run with an all-ones mask sent as before."""
from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch

from pipeline.core.app import compose

STEPS = 3


class RecordLosses(pl.Callback):
    def __init__(self):
        self.losses: list[float] = []
        self.masked: list[bool] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))
        self.masked.append("attention_mask" in batch)


def run(shards, out, tiny_overrides, *extra) -> tuple[RecordLosses, pl.LightningModule]:
    from pipeline.pretraining.run import train

    record = RecordLosses()

    class KeepModule(pl.Callback):
        def on_train_end(self, trainer, pl_module):
            record.module = pl_module

    train(compose("train", [*tiny_overrides(shards, out, STEPS), "data.global_batch_size=4", "data.micro_batch_size=2",
                            "export.hf=false", "export.plot=false",
                            "callbacks.checkpoint.every_n_train_steps=0", *extra]),
          extra_callbacks=[record, KeepModule()])
    return record, record.module


@pytest.fixture
def mask_always(monkeypatch):
    """The collator as it was: an all-ones mask on a batch without padding too."""
    from pipeline.pretraining.data.collator import PretrainingCollator

    arrays = PretrainingCollator.arrays

    def with_mask(self, rows, epoch):
        batch = arrays(self, rows, epoch)
        batch.setdefault("attention_mask", (batch["input_ids"] * 0 + 1))
        return batch

    monkeypatch.setattr(PretrainingCollator, "arrays", with_mask)


@pytest.mark.slow
def test_no_mask_and_compile_give_the_losses_of_the_masked_eager_run(wiki_shards, tmp_path, tiny_overrides,
                                                                       monkeypatch, request):
    """Wikipedia's shards: short articles make short rows, so some batches are padded (a book's rows are all full)."""
    new, _ = run(wiki_shards, tmp_path / "new", tiny_overrides)
    assert any(new.masked) and not all(new.masked)    # both kinds of batch occur (micro-batches of 2)

    request.getfixturevalue("mask_always")
    old, _ = run(wiki_shards, tmp_path / "old", tiny_overrides)
    assert all(old.masked)
    assert new.losses == old.losses                    # bitwise: an all-ones mask changes nothing

    monkeypatch.undo()
    # Inductor draws dropout's random numbers with its own generator unless told to use eager's (fallback_random):
    # with it both runs drop the same units, and only the fused kernels' rounding differs.
    monkeypatch.setattr(torch._inductor.config, "fallback_random", True)
    compiled, module = run(wiki_shards, tmp_path / "compiled", tiny_overrides, "model.compile=true",
                           "model.compile_scope=whole")
    assert module.model._compiled_call_impl is not None     # the whole model, heads and losses too
    assert all(compiled.masked)     # compiled: every batch max_seq_length wide and masked (one shape, one graph)
    assert compiled.losses == pytest.approx(new.losses, rel=1e-5)


def test_compile_under_zero_3_is_refused_before_anything_runs():
    from pipeline.pretraining.checks import preflight

    with pytest.raises(ValueError, match="model.compile=true with DeepSpeed ZeRO-3"):
        preflight(compose("train", ["model.compile=true", "strategy=deepspeed_stage_3"]), world_size=2)
    preflight(compose("train", ["model.compile=true", "strategy=deepspeed_stage_2"]), world_size=2)
