"""model.compile with data.unpad (issue 48, item 2): every distinct token count N of an unpadded batch is a shape, and
with dynamic=False a new shape recompiles the whole model; past torch's recompile limit (8) fullgraph=True raises
FailOnRecompileLimitHit rather than running eagerly. The token count is marked dynamic instead (module.py's
on_after_batch_transfer): one graph for every N. The real train() on real shards of many row lengths, with Dynamo's
graphs run as they are (backend="eager": the recompiles are Dynamo's, whatever the backend) and the limit brought
down to 1, so that the second distinct N stands for the ninth."""
from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch

from pipeline.core.app import compose
from tests.helpers.compile_counting import counting_compile


class RecordTokenCounts(pl.Callback):
    def __init__(self):
        self.token_counts: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.token_counts.append(len(batch["token_index"]))


# The whole model: N marked dynamic at its input, one graph. Its layers (compile_scope=layers): the first N compiled
# static, the second symbolic (automatic dynamic shapes), two graphs, shared by every layer.
@pytest.mark.parametrize("scope, graphs_made", [("whole", 1), ("layers", 2)])
def test_an_unpadded_compiled_run_compiles_one_graph_for_every_token_count(wiki_shards, tmp_path, tiny_overrides,
                                                                          monkeypatch, scope, graphs_made):
    graphs, _ = counting_compile(monkeypatch)
    from pipeline.pretraining.run import train

    record = RecordTokenCounts()
    overrides = [*tiny_overrides(wiki_shards, tmp_path / "run", 4), "model.compile=true",
                 f"model.compile_scope={scope}", "data.unpad=true", "export.hf=false", "export.plot=false",
                 "callbacks.checkpoint.every_n_train_steps=0"]
    with torch._dynamo.config.patch(recompile_limit=graphs_made):
        result = train(compose("train", overrides), extra_callbacks=[record])
    assert result["global_step"] == 4
    assert len(set(record.token_counts)) >= 2, record.token_counts   # several shapes, each a recompile before
    assert len(graphs) == graphs_made
