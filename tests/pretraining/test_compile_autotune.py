"""model.compile_autotune=true (issue 48 item 4, the bias+GELU epilogue): torch.compile's max-autotune mode, whose
matmul templates fuse the bias and GELU into the matmul where they win; the real train() with the real inductor on
the CPU (its C++ GEMM templates) trains the losses of the eager run, to rounding, and asks for the mode it names."""
from __future__ import annotations

import csv

import pytest
import torch

from pipeline.core.app import compose
from pipeline.pretraining.compiled import compile_mode


def test_the_mode_follows_autotune_and_cuda_graphs():
    assert [compile_mode({"compile_autotune": a, "cuda_graphs": g}) for a in (False, True) for g in (False, True)] == [
        "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"]


@pytest.mark.slow
def test_an_autotuned_compiled_run_trains_the_losses_of_the_eager_run(small_shards, tmp_path, tiny_overrides,
                                                                    monkeypatch):
    from pipeline.pretraining.run import train

    # Inductor draws dropout's random numbers with eager's generator (as test_attention_paths.py): the same units drop
    monkeypatch.setattr(torch._inductor.config, "fallback_random", True)
    modes = []
    original = torch.nn.Module.compile

    def compile_seen(self, *args, **kwargs):
        modes.append(kwargs["mode"])
        original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "compile", compile_seen)

    def losses(out, *extra):
        train(compose("train", [*tiny_overrides(small_shards, out, 3), "trainer.log_every_n_steps=1",
                                "data.pad_to_multiple_of=128", "export.hf=false", "export.plot=false",
                                "callbacks.checkpoint.every_n_train_steps=0", *extra]))
        with open(out / "csv" / "metrics.csv", newline="") as handle:
            return [float(row["train/loss"]) for row in csv.DictReader(handle) if row.get("train/loss")]

    eager = losses(tmp_path / "eager")
    torch._dynamo.reset()
    tuned = losses(tmp_path / "tuned", "model.compile=true", "model.compile_autotune=true")
    assert set(modes) == {"max-autotune-no-cudagraphs"} and len(modes) == 2     # tiny BERT's two layers
    assert len(eager) == 3 and tuned == pytest.approx(eager, rel=1e-4)
