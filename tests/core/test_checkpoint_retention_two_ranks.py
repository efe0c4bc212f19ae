"""Checkpoint retention where every rank writes the checkpoint: 2 CPU processes under DeepSpeed ZeRO-2 (a checkpoint
is a directory of each rank's shards), saving at every step with keep_last=2 and keep_every_n_steps=4, keep exactly
the directories of steps 4, 8, 11 and 12 and last.ckpt, each complete, with DeepSpeed's `latest` readable by the
group (umask 022: 0644) once the run is interrupted at step 12; the run resumes from them to step 14 and goes on
keeping what the policy says."""
from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

import pytest

from pipeline.core.checkpoints.checkpoint_files import LATEST, is_complete
from tests.helpers.ranks import local_launch_env, run_rank_group

# The pre-training on 2 CPU processes (Lightning's launcher re-runs this script for rank 1); with INTERRUPT_AT=<step>
# every rank stops with an error once that many steps are done (and saved), as a node failure would end the job.
SCRIPT = """
import os, sys
import torch
torch.set_num_threads(1)
import pytorch_lightning as pl
from pipeline.core.app import compose
from pipeline.pretraining.run import train

interrupt_at = int(os.environ.get("INTERRUPT_AT", "0"))

class Steps(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        print(f"RANK {trainer.global_rank} START_STEP {trainer.global_step}", flush=True)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if interrupt_at and trainer.global_step >= interrupt_at:
            raise SystemExit(f"RANK {trainer.global_rank} INTERRUPTED {trainer.global_step}")

result = train(compose("train", sys.argv[1:]), extra_callbacks=[Steps()])
print(f"RANK {result['rank']} FINAL_STEP {result['global_step']}", flush=True)
"""


def run(tmp_path: Path, output_dir: Path, torch_extensions_dir: str, shards: Path, interrupt_at: int = 0):
    """14 steps, a checkpoint at each."""
    script = tmp_path / "deepspeed_training.py"
    script.write_text(SCRIPT)
    env = local_launch_env(DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=torch_extensions_dir,
                           INTERRUPT_AT=str(interrupt_at))
    overrides = [f"data.path={shards}", f"output_dir={output_dir}", "trainer.devices=2", "strategy=deepspeed_stage_2",
                 "data.global_batch_size=4", "data.micro_batch_size=2", "data.num_workers=0",
                 "trainer.max_steps=14", "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false",
                 "trainer.enable_model_summary=false", "scheduler.warmup_steps=2",
                 "callbacks.checkpoint.every_n_train_steps=1", "callbacks.checkpoint.keep_last=2",
                 "callbacks.checkpoint.keep_every_n_steps=4", "ckpt_path=auto", "export.hf=false",
                 "export.plot=false", "data.verify_checksums=false"]
    previous = os.umask(0o022)          # the ranks inherit it
    try:
        return run_rank_group([sys.executable, str(script), *overrides], env, timeout_s=600)
    finally:
        os.umask(previous)


def steps(output: str, kind: str) -> set[int]:
    return {int(m) for m in re.findall(rf"RANK [01] {kind} (\d+)", output)}


def kept(checkpoint_dir: Path) -> set[str]:
    return {p.name for p in checkpoint_dir.iterdir() if not p.name.startswith(".")}


@pytest.mark.slow
def test_two_ranks_keep_the_newest_and_every_kth_deepspeed_checkpoint(tmp_path, small_shards, torch_extensions_dir):
    run_dir = tmp_path / "run"
    first = run(tmp_path, run_dir, torch_extensions_dir, small_shards, interrupt_at=12)
    log = first.stdout + first.stderr
    assert first.returncode != 0 and "INTERRUPTED 12" in log, log[-6000:]
    checkpoints = run_dir / "checkpoints"
    assert kept(checkpoints) == {"step0000004.ckpt", "step0000008.ckpt", "step0000011.ckpt", "step0000012.ckpt",
                                 "last.ckpt"}
    for checkpoint in checkpoints.iterdir():
        assert checkpoint.is_dir() and is_complete(checkpoint), checkpoint
        assert oct(stat.S_IMODE((checkpoint / LATEST).stat().st_mode)) == oct(0o644), checkpoint

    resumed = run(tmp_path, run_dir, torch_extensions_dir, small_shards)
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-6000:]
    assert steps(log, "START_STEP") == {12} and steps(log, "FINAL_STEP") == {14}
    assert kept(checkpoints) == {"step0000004.ckpt", "step0000008.ckpt", "step0000012.ckpt", "step0000013.ckpt",
                                 "step0000014.ckpt", "last.ckpt"}
    assert all(is_complete(checkpoint) for checkpoint in checkpoints.iterdir())
