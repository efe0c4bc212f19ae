"""Helpers of the training tests: the overrides of a tiny CPU run, and a training run as a separate process (killed
hard at a chosen step)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def tiny_run_overrides(shards: Path, output_dir: Path, max_steps: int = 10, *extra: str) -> list[str]:
    """A tiny-BERT CPU run of max_steps optimizer steps of 8 sequences (2 micro-batches of 4: accumulation)."""
    return [f"data.path={shards}", f"output_dir={output_dir}", "data.global_batch_size=8",
            "data.micro_batch_size=4", "data.num_workers=0", f"trainer.max_steps={max_steps}",
            "trainer.log_every_n_steps=2", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
            "scheduler.warmup_steps=2", "callbacks.checkpoint.every_n_train_steps=5", *extra]


# A training process as a separate program: `train(compose("train", argv))`, killed hard with SIGKILL at the start
# of the first batch once KILL_AT_STEP optimizer steps are done (the checkpoint of an earlier step on disk).
TRAIN_SCRIPT = """
import os, signal, sys
import torch
torch.set_num_threads(2)
import pytorch_lightning as pl
from pipeline.core.app import compose
from pipeline.pretraining.run import train

kill_at = int(os.environ.get("KILL_AT_STEP", "0"))

class KillHard(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

result = train(compose("train", sys.argv[1:]), extra_callbacks=[KillHard()] if kill_at else [])
print("FINAL_STEP", result["global_step"])
"""


def run_training_process(overrides: list[str], kill_at_step: int = 0, timeout: float = 300
                         ) -> subprocess.CompletedProcess:
    env = {**os.environ, "KILL_AT_STEP": str(kill_at_step), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-c", TRAIN_SCRIPT, *overrides],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
