"""A resume with a changed config on 2 CPU ranks (DDP over gloo): accepted, both ranks train the new schedule from the
resumed step (rank 1, which Lightning starts inside the fit, too); not accepted, with both ranks started at once as
SLURM and torchrun start them, both refuse before any collective and neither waits on the other."""
from __future__ import annotations

import json
import socket
import sys

import pytest

from pipeline.core.optim.optimizers import lr_factor
from tests.helpers.ranks import local_launch_env, run_rank_group

FIRST_STEPS, NEW_STEPS, NEW_LR, WARMUP = 4, 6, 5e-2, 2

# Each rank writes the rates of its parameter groups at every optimizer step it takes to OUT/rank<R>.jsonl.
RECORDING_RUN = """
import json, os, sys
import torch
torch.set_num_threads(1)
import pytorch_lightning as pl
from pipeline.core.app import compose
from pipeline.pretraining.run import train

out = sys.argv[1]


class RecordRates(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        rates = [group["lr"] for group in trainer.optimizers[0].param_groups]
        with open(os.path.join(out, f"rank{trainer.global_rank}.jsonl"), "a") as handle:
            handle.write(json.dumps({"step": trainer.global_step, "lr": rates}) + "\\n")


train(compose("train", sys.argv[2:]), extra_callbacks=[RecordRates()])
"""

# Both ranks of a 2-process job started at once, each told its rank (as srun or torchrun start them); prints each
# rank's exit status and whether its error was the refusal.
BOTH_RANKS_AT_ONCE = """
import json, os, subprocess, sys
port, script, *args = sys.argv[1:]
procs = [subprocess.Popen([sys.executable, script, *args], stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2",
                               "NODE_RANK": "0", "RANK": str(rank), "LOCAL_RANK": str(rank)}) for rank in (0, 1)]
errors = [proc.communicate()[1] for proc in procs]
print(json.dumps([[proc.returncode, "ResumeRefused" in err and "trainer.max_steps: 4 -> 6" in err]
                  for proc, err in zip(procs, errors)]))
"""


def overrides(shards, output_dir, max_steps, *extra):
    return [f"data.path={shards}", f"output_dir={output_dir}", "trainer.devices=2", "strategy=ddp",
            "data.global_batch_size=4", "data.micro_batch_size=1", "data.num_workers=1",
            f"trainer.max_steps={max_steps}",
            "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
            f"scheduler.warmup_steps={WARMUP}", "callbacks.checkpoint.every_n_train_steps=0", "export.hf=false",
            "export.plot=false", *extra]


def rates(out, rank) -> dict[int, list[float]]:
    return {r["step"]: r["lr"] for r in map(json.loads, (out / f"rank{rank}.jsonl").read_text().splitlines())}


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.slow
def test_both_ranks_train_an_accepted_schedule_and_both_refuse_an_unaccepted_one(small_shards, tmp_path):
    script, out, run_dir = tmp_path / "run.py", tmp_path / "rates", tmp_path / "run"
    script.write_text(RECORDING_RUN)
    out.mkdir()
    first = run_rank_group([sys.executable, str(script), str(out), *overrides(small_shards, run_dir, FIRST_STEPS)],
                           local_launch_env(), 300)
    assert first.returncode == 0, first.stderr[-6000:]

    refused = run_rank_group([sys.executable, "-c", BOTH_RANKS_AT_ONCE, free_port(), str(script), str(out),
                              *overrides(small_shards, run_dir, NEW_STEPS, "ckpt_path=auto", f"optimizer.lr={NEW_LR}")],
                             local_launch_env(), 300)
    assert refused.returncode == 0, refused.stderr[-6000:]
    assert json.loads(refused.stdout.splitlines()[-1]) == [[1, True], [1, True]]

    accepted = run_rank_group([sys.executable, str(script), str(out), *overrides(
        small_shards, run_dir, NEW_STEPS, "ckpt_path=auto", f"optimizer.lr={NEW_LR}",
        "resume.accept_changes=[trainer.max_steps,optimizer.lr]")], local_launch_env(), 300)
    assert accepted.returncode == 0, accepted.stderr[-6000:]
    for rank in (0, 1):
        got = rates(out, rank)
        assert sorted(got) == list(range(NEW_STEPS))
        for step in (4, 5):
            assert got[step] == pytest.approx([NEW_LR * lr_factor(step, WARMUP, NEW_STEPS)] * 2, rel=1e-12), rank
