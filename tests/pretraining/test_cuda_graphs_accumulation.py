"""model.cuda_graphs with gradient accumulation (issue 48, item 1): under CUDA graph trees the compiled backward's
outputs live in the graph's memory pool, and a gradient that autograd adopts as a parameter's .grad (what it does
when .grad is None) is overwritten by the next micro-batch's replay: torch 2.13 raises "accessing gradient tensor
output of CUDAGraphs". The module keeps every .grad allocated outside the pool instead, zeroed in place, so that the
compiled backward's output is added into it. The real train() on real shards, with a backend that runs Dynamo's
graphs as they are (CUDA graphs do not exist on the CPU; what the module does to the gradients does)."""
from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch

from pipeline.core.app import compose


class RecordGradients(pl.Callback):
    """Before each micro-batch's backward: whether every trainable parameter has a .grad, and where each one lives."""

    def __init__(self):
        self.allocated: list[bool] = []
        self.addresses: list[tuple[int, ...]] = []

    def on_before_backward(self, trainer, pl_module, loss):
        grads = [p.grad for p in pl_module.model.parameters() if p.requires_grad]
        self.allocated.append(all(g is not None for g in grads))
        self.addresses.append(tuple(g.data_ptr() if g is not None else 0 for g in grads))


def run(shards, out, tiny_overrides, monkeypatch, *extra: str) -> RecordGradients:
    original = torch.nn.Module.compile

    def compile_without_inductor(self, *args, **kwargs):   # Dynamo's graph run as it is: seconds, not minutes
        original(self, fullgraph=kwargs["fullgraph"], dynamic=kwargs["dynamic"], backend="eager")

    monkeypatch.setattr(torch.nn.Module, "compile", compile_without_inductor)
    torch._dynamo.reset()
    from pipeline.pretraining.run import train

    record = RecordGradients()
    train(compose("train", [*tiny_overrides(shards, out, 3), "model.compile=true", *extra,
                            "export.hf=false", "export.plot=false", "callbacks.checkpoint.every_n_train_steps=0"]),
          extra_callbacks=[record])
    return record


def test_gradients_stay_allocated_outside_the_graph_pool_across_accumulated_micro_batches(
        small_shards, tmp_path, tiny_overrides, monkeypatch):
    record = run(small_shards, tmp_path / "graphs", tiny_overrides, monkeypatch, "model.cuda_graphs=true")
    assert len(record.allocated) == 6                     # 3 steps of 2 accumulated micro-batches (tiny_overrides)
    assert all(record.allocated), record.allocated       # before the very first backward too
    assert len(set(record.addresses)) == 1               # the same buffers throughout: zeroed in place, never replaced


def test_without_cuda_graphs_gradients_are_freed_at_each_step(small_shards, tmp_path, tiny_overrides, monkeypatch):
    """torch's default (set_to_none) where nothing replays: the first micro-batch of each step adopts its gradients."""
    record = run(small_shards, tmp_path / "compiled", tiny_overrides, monkeypatch)
    assert record.allocated == [False, True] * 3


def test_under_deepspeed_cuda_graphs_with_accumulation_are_refused_before_the_start():
    """DeepSpeed steps and zeroes the gradients itself (set to None), so the module cannot keep them out of the pool:
    refused in the pre-flight checks wherever a step may take more than one pass; one pass a step is let through."""
    from pipeline.pretraining.checks import preflight

    graphs = ["model.compile=true", "model.cuda_graphs=true", "strategy=deepspeed_stage_1", "trainer.max_steps=100",
              "data.global_batch_size=64"]
    message = "model.cuda_graphs=true with strategy=deepspeed and gradient accumulation"
    for passes in (["data.micro_batch_size=16"], ["data.micro_batch_size=auto"]):   # 4 a step; auto: maybe several
        with pytest.raises(ValueError, match=message):
            preflight(compose("train", [*graphs, *passes]), world_size=1)
    preflight(compose("train", [*graphs, "data.micro_batch_size=64"]), world_size=1)
    preflight(compose("train", [*graphs[:2], "strategy=ddp", "trainer.max_steps=100", "data.global_batch_size=64",
                                "data.micro_batch_size=16"]), world_size=1)      # the module keeps them (above)
