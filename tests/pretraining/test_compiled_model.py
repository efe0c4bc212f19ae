"""model.compile=true compiles the whole pre-training model, encoder, heads and losses, as one graph per sequence
length (issue 35, item 3): the real train() on real shards, with a graph-counting backend in place of inductor
(the graphs are what Dynamo hands any backend); and strategy=ddp on one process is no DDP at all."""
from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch

from pipeline.core.app import compose
from tests.helpers.compile_counting import counting_compile


class RecordBatches(pl.Callback):
    def __init__(self):
        self.shapes: list[tuple[int, ...]] = []
        self.masked: list[bool] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.shapes.append(tuple(batch["input_ids"].shape))
        self.masked.append("attention_mask" in batch)
        self.strategy = type(trainer.strategy).__name__


def test_the_whole_model_with_its_losses_compiles_as_one_graph_per_sequence_length(small_shards, tmp_path,
                                                                                   tiny_overrides, monkeypatch):
    graphs, compile_calls = counting_compile(monkeypatch)
    from pipeline.pretraining.run import train

    record = RecordBatches()
    overrides = [*tiny_overrides(small_shards, tmp_path / "run", 3), "model.compile=true", "model.compile_scope=whole",
                 "data.pad_to_multiple_of=8", "strategy=ddp", "export.hf=false", "export.plot=false",
                 "callbacks.checkpoint.every_n_train_steps=0"]
    train(compose("train", overrides), extra_callbacks=[record])
    assert compile_calls == [{"module": "BertForPreTraining", "fullgraph": True, "dynamic": False, "mode": "default"}]
    assert set(record.shapes) == {(4, 128)} and all(record.masked)     # fixed width, always masked: one shape
    assert len(graphs) == 1                                              # 6 micro-batches, one graph
    assert not torch._dynamo.utils.counters["graph_break"]
    # the heads and losses are in the graph: the MLM gather, and both cross-entropies (model/bert/model.py's autograd
    # Function, its forward and its hand-written backward as subgraphs)
    targets = {str(node.target) for node in graphs[0].graph.nodes}
    assert any("gather" in t for t in targets) and {"autograd_function_apply", "argmax"} <= targets
    assert {"fwd_body_0", "bwd_body_0", "fwd_body_1", "bwd_body_1"} <= targets
    assert record.strategy == "SingleDeviceStrategy"                     # strategy=ddp on one process: no DDP


def test_the_encoder_layer_compiles_once_for_every_layer_of_the_stack(small_shards, tmp_path, tiny_overrides,
                                                                    monkeypatch):
    """model.compile_scope=layers (the default): each of the stack's 10 layers compiled in place, and Dynamo hands
    the backend one graph for all of them (one code object, the weights its inputs), past torch's recompile limit of
    8 that one graph per layer would hit; the checkpoint keeps the module's own names."""
    graphs, compile_calls = counting_compile(monkeypatch)
    from pipeline.pretraining.run import train

    out = tmp_path / "run"
    train(compose("train", [*tiny_overrides(small_shards, out, 3), "model.compile=true", "+model.num_layers=10",
                            "export.hf=false", "export.plot=false", "callbacks.checkpoint.every_n_train_steps=0"]))
    assert compile_calls == [{"module": "EncoderLayer", "fullgraph": True, "dynamic": False, "mode": "default"}] * 10
    assert len(graphs) == 1 and not torch._dynamo.utils.counters["graph_break"]
    names = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert not any("_orig_mod" in name for name in names) and any(".layers.9." in name for name in names)


def test_cuda_graphs_without_compile_is_refused(small_shards, tmp_path, tiny_overrides):
    from pipeline.pretraining.run import train

    with pytest.raises(ValueError, match="model.cuda_graphs=true replays the compiled graph: set model.compile=true"):
        train(compose("train", [*tiny_overrides(small_shards, tmp_path / "run", 3), "model.cuda_graphs=true"]))
