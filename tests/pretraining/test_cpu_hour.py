"""+experiment=cpu_hour, the CPU recipe of studies/pretraining_pays/bench_cpu_recipe.py: its hour is cut as the
downstream curve needs it (a checkpoint every quarter, ten held-out validations), it passes pre-training's pre-flight
on one CPU, and it trains from the shards of its own data-prep preset with held-out validation and quarter
checkpoints (scaled down to a few steps)."""
from __future__ import annotations

import csv
from pathlib import Path

from pipeline.core.app import compose
from pipeline.pretraining.checks import preflight
from pipeline.pretraining.run import train


def test_the_hour_is_cut_into_quarters_and_tenths():
    cfg = compose("train", ["+experiment=cpu_hour"])
    steps = cfg.trainer.max_steps
    assert cfg.callbacks.checkpoint.every_n_train_steps * 4 == steps      # checkpoints at 15, 30, 45, 60 minutes
    assert cfg.validation.every_n_steps * 10 == steps
    assert (cfg.model.name, cfg.optimizer.name, cfg.optimizer.lr, cfg.scheduler.warmup_fraction) == \
        ("tiny", "adamw", 1e-3, 0.06)
    assert cfg.trainer.accelerator == "cpu" and cfg.data.path.endswith("outputs/shards/cpu_hour")
    shape = preflight(cfg, world_size=1)
    assert (shape.micro_batch_size, shape.accumulation) == (32, 1)


def test_it_trains_with_held_out_validation_and_keeps_every_quarter(small_shards, tmp_path):
    """The recipe with its hour scaled to 8 steps: held-out validation every 2 steps, a kept checkpoint every 2."""
    run = tmp_path / "run"
    result = train(compose("train", [
        "+experiment=cpu_hour", f"data.path={small_shards}", f"validation.path={small_shards}",
        "trainer.max_steps=8", "validation.every_n_steps=2", "validation.max_batches=1", "data.micro_batch_size=8",
        "data.global_batch_size=8", "callbacks.checkpoint.every_n_train_steps=2", "data.num_workers=0",
        "trainer.enable_progress_bar=false", "export.hf=false", "export.plot=false", f"output_dir={run}"]))
    out = Path(result["output_dir"])
    with open(out / "csv" / "metrics.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("val/mlm_acc")]
    assert len(rows) == 4
    kept = sorted(p.name for p in (out / "checkpoints").glob("step*.ckpt"))
    assert kept == [f"step{s:07d}.ckpt" for s in (2, 4, 6, 8)]
