"""Held-out validation on 2 CPU processes (DDP over gloo): each rank scores its own share of the held-out set and the
logged metrics are those of both shares together, not rank 0's alone."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.ranks import local_launch_env, run_rank_group

REPO_ROOT = Path(__file__).resolve().parents[2]


def _expected(run_dir: Path, shards: Path, micro_batch: int) -> dict[str, float]:
    """The held-out metrics computed here, in one process, from the run's weights over both ranks' shares."""
    from omegaconf import OmegaConf

    from pipeline.core.checkpoints.weights import load_pretraining_model
    from pipeline.pretraining.data.dataset import PretrainingDataset
    from pipeline.pretraining.data.shard_set import ShardSet

    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    model = load_pretraining_model(run_dir / "checkpoints" / "last.ckpt")
    model.eval()
    shard_set = ShardSet.open(shards, max_seq_length=128, vocab_size=model.config.vocab_size)
    sums = torch.zeros(6, dtype=torch.float64)
    with torch.no_grad():
        for rank in (0, 1):
            for batch in PretrainingDataset(shard_set, micro_batch, rank=rank, world_size=2, seed=int(cfg.seed)):
                out = model(**batch)
                sums += torch.tensor([float(out.mlm_loss) * int(out.mlm_total), int(out.mlm_total),
                                      int(out.mlm_correct), float(out.nsp_loss) * int(out.nsp_total),
                                      int(out.nsp_total), int(out.nsp_correct)], dtype=torch.float64)
    return {"val/mlm_loss": sums[0] / sums[1], "val/mlm_acc": sums[2] / sums[1], "val/nsp_loss": sums[3] / sums[4],
            "val/nsp_acc": sums[5] / sums[4]}


@pytest.mark.slow
def test_two_ranks_validate_the_whole_held_out_set_together(small_shards, tiny_overrides, tmp_path):
    run_dir = tmp_path / "run"
    # lr 0: the weights stay those of the checkpoint, so the metrics can be recomputed from it afterwards.
    overrides = [o for o in tiny_overrides(small_shards, run_dir, 4, "trainer.devices=2", "strategy=ddp",
                                           "data.micro_batch_size=2", "optimizer.lr=0", "export.hf=false",
                                           "export.plot=false", f"validation.path={small_shards}",
                                           "validation.every_n_steps=4")
                 if not o.startswith("output_dir=")] + [f"hydra.run.dir={run_dir}"]
    done = run_rank_group([sys.executable, str(REPO_ROOT / "pipeline" / "train.py"), *overrides], local_launch_env(),
                          timeout_s=900)
    assert done.returncode == 0, done.stderr[-4000:]
    with open(run_dir / "csv" / "metrics.csv") as handle:
        logged = [row for row in csv.DictReader(handle) if row.get("val/mlm_acc")]
    assert len(logged) == 1
    expected = _expected(run_dir, small_shards, micro_batch=2)
    for key, value in expected.items():
        assert float(logged[0][key]) == pytest.approx(float(value), rel=1e-5), key
