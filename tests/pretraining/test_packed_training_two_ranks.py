"""data.packing=true on 2 CPU ranks (DDP over gloo), with 2 loader workers a rank: each rank packs its own
micro-batches, so the ranks hold different numbers of rows at the same step, and DDP's gradient average must not care.
Without dropout, the packed run is the unpacked run up to float rounding, rank by rank and step by step, its
weights included; and every pair still trains once, on fewer rows."""
from __future__ import annotations

import json
import sys

import pytest

from tests.helpers.ranks import local_launch_env, run_rank_group

N = 4
# Each rank records, per micro-batch, its loss, its rows and its labelled pairs, and at the end its weights.
SCRIPT = """
import json, os, sys
import torch
torch.set_num_threads(1)
import pytorch_lightning as pl
from pipeline.core.app import compose
from pipeline.pretraining.run import train

out = sys.argv[1]


class Record(pl.Callback):
    def _write(self, trainer, record):
        with open(os.path.join(out, f"rank{trainer.global_rank}.jsonl"), "a") as handle:
            handle.write(json.dumps(record) + "\\n")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._write(trainer, {"step": trainer.global_step, "loss": float(outputs["loss"]),
                              "rows": batch["input_ids"].shape[0],
                              "pairs": int((batch["next_sentence_labels"] != -100).sum())})

    def on_train_end(self, trainer, pl_module):
        weights = {name: value.detach().double().flatten()[:64].tolist()
                   for name, value in sorted(pl_module.state_dict().items()) if value.is_floating_point()}
        self._write(trainer, {"weights": weights})


train(compose("train", sys.argv[2:]), extra_callbacks=[Record()])
"""


def overrides(shards, output_dir, *extra: str) -> list[str]:
    return [f"data.path={shards}", f"output_dir={output_dir}", "trainer.devices=2", "strategy=ddp",
            "data.global_batch_size=16", "data.micro_batch_size=8", "data.num_workers=2", f"trainer.max_steps={N}",
            "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
            "scheduler.warmup_steps=2", "callbacks.checkpoint.every_n_train_steps=0", "export.hf=false",
            "export.plot=false", "data.verify_checksums=false", "model.hidden_dropout=0.0",
            "model.attention_dropout=0.0", *extra]


def run(tmp_path, name, shards, *extra: str) -> list[list[dict]]:
    script, out = tmp_path / "packed_training.py", tmp_path / name
    script.write_text(SCRIPT)
    out.mkdir(parents=True)
    result = run_rank_group([sys.executable, str(script), str(out), *overrides(shards, tmp_path / f"{name}_run",
                                                                                *extra)], local_launch_env(), 300)
    assert result.returncode == 0, result.stderr[-6000:]
    return [[json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()] for rank in (0, 1)]


@pytest.mark.slow
def test_two_ranks_train_packed_pairs_as_the_unpacked_run(wiki_shards, tmp_path):
    unpacked, packed = run(tmp_path, "unpacked", wiki_shards), run(tmp_path, "packed", wiki_shards, "data.packing=true")
    for rank in (0, 1):
        plain = [r for r in unpacked[rank] if "loss" in r]
        packs = [r for r in packed[rank] if "loss" in r]
        assert [r["step"] for r in packs] == [r["step"] for r in plain] == list(range(1, N + 1))   # after each step
        assert [r["pairs"] for r in packs] == [r["pairs"] for r in plain] == [8] * N       # every pair, once
        assert all(r["rows"] == 8 for r in plain)
        assert [r["loss"] for r in packs] == pytest.approx([r["loss"] for r in plain], rel=1e-5), f"rank {rank}"
        (plain_weights,), (packed_weights,) = ([r["weights"] for r in side[rank] if "weights" in r]
                                               for side in (unpacked, packed))
        assert plain_weights.keys() == packed_weights.keys()
        for name in plain_weights:
            assert packed_weights[name] == pytest.approx(plain_weights[name], rel=1e-4, abs=1e-6), name
    rows = [sum(r["rows"] for r in packed[rank] if "loss" in r) for rank in (0, 1)]
    assert sum(rows) < 2 * 8 * N                     # fewer rows in all ...
    steps = [[r["rows"] for r in packed[rank] if "loss" in r] for rank in (0, 1)]
    assert steps[0] != steps[1]                      # ... and the ranks' row counts differ at some step
