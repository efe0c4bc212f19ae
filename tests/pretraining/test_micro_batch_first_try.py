"""data.micro_batch_size=auto's probe at its first try (issue 48, item 5). For one GPU the whole per-process batch of
a recipe is 65,536 sequences: SDPA's memory-efficient kernel takes at most 65,535 a call, and raises an error that
is not an out-of-memory one, which aborted the run. The first try is capped below that; an error at a size that a
smaller size does not repeat passes that size over (a bug that every size repeats still stops the run); and the
peak memory the run reports afterwards starts after the probe, not at its largest pass."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from pipeline.core.speed import micro_batch
from pipeline.core.speed.micro_batch import GIB, candidates, largest_that_fits


def test_the_first_try_never_exceeds_what_one_attention_call_takes_nor_the_per_process_batch():
    assert micro_batch.MAX_SEQUENCES_PER_PASS == 65_535
    assert candidates(65_536)[0] == 32_768        # the largest divisor within the cap
    assert candidates(3 * 65_536)[0] == 49_152
    assert candidates(65_535)[0] == 65_535
    assert candidates(24) == [24, 12, 8, 6, 4, 3, 2, 1]
    tried = []
    largest_that_fits(65_536, lambda size: tried.append(size) or size, total_bytes=10**12, margin=0.1)
    assert tried == [32_768]


def kernel_limit(size: int) -> int:
    """A pass whose kernel refuses sizes over 16 (not out of memory), and otherwise peaks at a GiB a sequence."""
    if size > 16:
        raise RuntimeError("CUDA error: invalid configuration argument")
    return size * GIB


def test_an_error_that_a_smaller_size_does_not_repeat_passes_that_size_over(caplog):
    with caplog.at_level(logging.WARNING, logger="pipeline.pretraining"):
        fit = largest_that_fits(64, kernel_limit, total_bytes=80 * GIB, margin=0.1)
    assert fit.size == 16
    assert "64 sequences a pass failed (RuntimeError: CUDA error: invalid configuration argument)" in caplog.text


def test_an_error_that_every_size_repeats_stops_the_run():
    def broken(size):
        raise ValueError(f"a bug at {size}")

    with pytest.raises(ValueError, match="a bug at 1$"):      # the smallest's own error, with its traceback
        largest_that_fits(8, broken, total_bytes=80 * GIB, margin=0.1)


def test_the_peak_memory_after_the_probe_starts_after_it(monkeypatch):
    """The real probe's passes (on the CPU, injected peaks), then the reset of the device's peak statistics."""
    from model import BertConfig, BertForPreTraining
    from pipeline.core.speed.micro_batch import plan_micro_batch

    events = []

    class Probe(micro_batch.PassProbe):
        def __call__(self, size):
            events.append(("pass", size))
            self.run_pass(size)
            return {8: 95 * GIB, 4: 50 * GIB}[size]

    forget = micro_batch.forget_peak_memory
    monkeypatch.setattr(micro_batch, "PassProbe", Probe)
    monkeypatch.setattr(micro_batch, "device_memory_bytes", lambda device: 100 * GIB)
    monkeypatch.setattr(micro_batch, "forget_peak_memory", lambda device: events.append(("forget", device.type))
                        or forget(device))
    plan = plan_micro_batch({"global_batch_size": 8, "micro_batch_size": "auto", "max_seq_length": 32},
                            {"accelerator": "gpu", "precision": "32-true"}, 1, micro_batch.Path("/nonexistent"),
                            resume_from=None)
    trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu")),
                              datamodule=SimpleNamespace(shard_set=SimpleNamespace(max_predictions_per_seq=5)))
    module = SimpleNamespace(model=BertForPreTraining(BertConfig.from_preset("tiny")))
    size, fit = plan.callback()._probe(trainer, module)
    assert (size, fit.size) == (4, 4)
    assert events == [("pass", 8), ("pass", 4), ("forget", "cpu")]
