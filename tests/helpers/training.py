"""Helpers of the training tests: the overrides of a tiny CPU run, and a training run as a separate process (killed
hard at a chosen step)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.ranks import local_launch_env, run_rank_group

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


# A pre-training run on 2 CPU processes (DDP over gloo; Lightning's launcher re-runs this script for rank 1), each
# rank recording its own loss of every micro-batch (the float's exact bits), its batch's width and its RNG state at
# the start of the fit to OUT/rank<R>.jsonl; each rank takes SIGKILL at the start of the first batch once KILL_AT
# optimizer steps are done.
TWO_RANK_SCRIPT = """
import hashlib, json, os, signal, sys
import torch
torch.set_num_threads(1)
import pytorch_lightning as pl
from pipeline.core.app import compose
from pipeline.pretraining.run import train

out, kill_at = sys.argv[1], int(sys.argv[2])


class RecordEachRank(pl.Callback):
    def _write(self, trainer, record):
        with open(os.path.join(out, f"rank{trainer.global_rank}.jsonl"), "a") as handle:
            handle.write(json.dumps(record) + "\\n")

    def on_train_start(self, trainer, pl_module):
        state = hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()
        self._write(trainer, {"start_step": trainer.global_step, "rng": state})

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if kill_at and trainer.global_step >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        self.step = trainer.global_step         # the optimizer step this micro-batch belongs to

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # outputs["loss"]: this rank's loss of this micro-batch (divided by the accumulation, exactly: a power of 2)
        self._write(trainer, {"step": self.step, "batch": batch_idx, "loss": float(outputs["loss"]).hex(),
                              "width": int(batch["input_ids"].shape[1])})


train(compose("train", sys.argv[3:]), extra_callbacks=[RecordEachRank()])
"""


def run_two_rank_training(script_dir: Path, out: Path, overrides: list[str], kill_at_step: int = 0,
                          timeout: float = 300) -> subprocess.CompletedProcess:
    """TWO_RANK_SCRIPT with `overrides` (add trainer.devices=2 and a strategy); records in `out`. A run takes
    ~17 s (the resume test's three: 51 s in a full CI run); past `timeout` the test fails showing every process's
    stacks."""
    script = script_dir / "two_rank_training.py"
    script.write_text(TWO_RANK_SCRIPT)
    out.mkdir(parents=True, exist_ok=True)
    return run_rank_group([sys.executable, str(script), str(out), str(kill_at_step), *overrides],
                          local_launch_env(), timeout)
