"""Every strategy trains BERT with the same optimizer, parameter groups and schedule, and so the same losses: the real
pre-training run (train() on a real shard set) on 2 CPU processes under auto, ddp and each DeepSpeed stage."""
from __future__ import annotations

import csv
import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.ranks import local_launch_env, run_rank_group

STRATEGIES = ["auto", "ddp", "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_2_offload",
              "deepspeed_stage_3", "deepspeed_stage_3_offload"]

# Lightning's subprocess launcher re-runs this file for rank 1, so it is a file, not `python -c`.
RUN_SCRIPT = textwrap.dedent('''
    import json, sys
    import pytorch_lightning as pl
    import torch
    from pipeline.core.app import compose
    from pipeline.pretraining.run import train

    torch.set_num_threads(1)
    out = sys.argv[1]


    class Record(pl.Callback):
        """The groups and rates of the optimizer the strategy steps, on this rank."""

        def on_train_end(self, trainer, pl_module):
            optimizer = trainer.optimizers[0]
            stepped = getattr(optimizer, "optimizer", optimizer)   # under ZeRO: the module's, wrapped by DeepSpeed
            record = {"rank": trainer.global_rank, "world_size": trainer.world_size,
                      "strategy": type(trainer.strategy).__name__, "optimizer": type(stepped).__name__,
                      "groups": [[g.get("name"), g["weight_decay"]] for g in stepped.param_groups],
                      "lrs": [g["lr"] for g in stepped.param_groups]}
            with open(f"{out}/rank{trainer.global_rank}.json", "w") as handle:
                json.dump(record, handle)


    train(compose("train", sys.argv[2:]), extra_callbacks=[Record()])
''')


def run_strategy(strategy: str, shards: Path, tmp_path: Path, tiny_overrides, extensions_dir: str) -> list[dict]:
    script, out = tmp_path / "run.py", tmp_path / strategy
    script.write_text(RUN_SCRIPT)
    out.mkdir()
    # 2 ranks x micro-batch 2 x accumulation 2 = the global batch of 8; 4 optimizer steps, warmup 2 of 4.
    overrides = [*tiny_overrides(shards, out / "run", 4, "trainer.devices=2", "data.micro_batch_size=2",
                                 f"strategy={strategy}", "export.hf=false", "export.plot=false")]
    overrides = [o.replace("trainer.log_every_n_steps=2", "trainer.log_every_n_steps=1") for o in overrides]
    env = local_launch_env(DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=extensions_dir)
    proc = run_rank_group([sys.executable, str(script), str(out), *overrides], env, timeout_s=900)
    assert proc.returncode == 0, f"{strategy}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    with open(out / "run" / "csv" / "metrics.csv", newline="") as handle:   # what the run logs: the mean over ranks
        ranks[0]["losses"] = [float(row["train/loss"]) for row in csv.DictReader(handle) if row.get("train/loss")]
    return ranks


@pytest.mark.slow
def test_every_strategy_trains_with_the_same_groups_schedule_and_losses(small_shards, tmp_path, tiny_overrides,
                                                                          torch_extensions_dir):
    runs = {strategy: run_strategy(strategy, small_shards, tmp_path, tiny_overrides, torch_extensions_dir)
            for strategy in STRATEGIES}
    reference = runs["auto"]
    for strategy, ranks in runs.items():
        for rank, record in enumerate(ranks):
            assert record["world_size"] == 2
            # BERT's two groups (no weight decay on biases and LayerNorm), never DeepSpeed's single group
            assert record["groups"] == [["decay", 0.01], ["no_decay", 0.0]], strategy
            expected_optimizer = "DeepSpeedCPUAdam" if strategy.endswith("offload") else "AdamW"
            assert record["optimizer"] == expected_optimizer, strategy
            # the same schedule: every group at the same rate after the last step
            assert record["lrs"] == pytest.approx(reference[rank]["lrs"]), strategy
        # the same micro-batches and weights give the same losses, step by step, up to the update's summation order
        assert len(ranks[0]["losses"]) == len(reference[0]["losses"]) == 4, strategy
        assert ranks[0]["losses"] == pytest.approx(reference[0]["losses"], rel=1e-5), strategy
    assert runs["ddp"][0]["strategy"] == "DDPStrategy"
    assert {runs[s][0]["strategy"] for s in STRATEGIES if s.startswith("deepspeed")} == {"CPUDeepSpeedStrategy"}
