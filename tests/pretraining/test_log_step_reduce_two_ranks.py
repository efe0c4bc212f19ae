"""The log step's reduction of the window sums over the ranks (issue 48, item 7): one all_reduce inside the forward,
no barrier. Lightning's strategy.reduce puts torch.distributed.barrier() before its all_reduce (lightning_fabric's
_sync_ddp), and under NCCL the host waits in a barrier. 2 CPU processes (DDP over gloo), the real train() on real
shards: the child counts the barriers each rank enters inside training_step, and records each micro-batch's loss, so
that the logged train/loss is checked to be the mean over both ranks' micro-batches of its window."""
from __future__ import annotations

import csv
import json
import sys
import textwrap

import pytest

from tests.helpers.ranks import local_launch_env, run_rank_group

MAX_STEPS, EVERY, ACCUMULATION = 4, 2, 2

RUN_SCRIPT = textwrap.dedent('''
    import functools, json, sys
    import torch
    import torch.distributed as torch_dist

    torch.set_num_threads(1)
    out = sys.argv[1]
    IN_STEP = []
    BARRIERS = []     # global_step of each barrier entered inside training_step

    barrier = torch_dist.barrier

    @functools.wraps(barrier)
    def counted_barrier(*args, **kwargs):
        if IN_STEP:
            BARRIERS.append(IN_STEP[-1])
        return barrier(*args, **kwargs)

    torch_dist.barrier = counted_barrier

    import pytorch_lightning as pl
    from pipeline.core.app import compose
    from pipeline.pretraining.run import train


    class Record(pl.Callback):
        def __init__(self):
            self.losses = []   # (global step, micro-batch loss)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            IN_STEP.append(trainer.global_step)

        def on_before_backward(self, trainer, pl_module, loss):
            IN_STEP.clear()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            step = trainer.global_step - (0 if trainer.fit_loop._should_accumulate() else 1)
            self.losses.append([step, float(outputs["loss"]) * trainer.accumulate_grad_batches])

        def on_train_end(self, trainer, pl_module):
            with open(f"{out}/rank{trainer.global_rank}.json", "w") as handle:
                json.dump({"barriers": BARRIERS, "losses": self.losses}, handle)


    train(compose("train", sys.argv[2:]), extra_callbacks=[Record()])
''')


@pytest.mark.slow
def test_the_log_step_sums_over_the_ranks_without_a_barrier(small_shards, tiny_overrides, tmp_path):
    script, out = tmp_path / "run.py", tmp_path / "out"
    script.write_text(RUN_SCRIPT)
    out.mkdir()
    # 2 ranks x micro-batch 2 x accumulation 2 = the global batch of 8; log every 2 steps
    overrides = tiny_overrides(small_shards, out / "run", MAX_STEPS, "trainer.devices=2", "strategy=ddp",
                               "data.micro_batch_size=2", "export.hf=false", "export.plot=false",
                               "callbacks.checkpoint.every_n_train_steps=0")
    done = run_rank_group([sys.executable, str(script), str(out), *overrides], local_launch_env(), timeout_s=900)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [rank["barriers"] for rank in ranks] == [[], []]
    with open(out / "run" / "csv" / "metrics.csv") as handle:
        logged = {int(row["step"]): float(row["train/loss"]) for row in csv.DictReader(handle) if row.get("train/loss")}
    assert sorted(logged) == [EVERY - 1, 2 * EVERY - 1]   # Lightning's step column: global_step - 1 at the log step
    for last_step in logged:
        window = [loss for rank in ranks for step, loss in rank["losses"] if last_step - EVERY < step <= last_step]
        assert len(window) == 2 * EVERY * ACCUMULATION
        assert logged[last_step] == pytest.approx(sum(window) / len(window), rel=1e-6)
