"""One trainer per run directory (pipeline/core/cluster/run_dir_lock.py): a second training started on the run directory
of a live one is refused, naming it, before it touches anything there (a resume's start-up would remove the partial
checkpoint file that the live one may be writing). A real training holds the directory, parked at its second step
until the test lets it go:

- locally, a training process, and a second training in this process, refused naming host and pid; the holder then
  finishes, and its lock is gone;
- on the real local SLURM, the holder a SLURM job of 2 ranks (srun tasks, DDP over gloo: rank 1 must not refuse its
  own rank 0), the second one another job (`python pipeline/train.py`, with ckpt_path=auto as the workflow's stage and
  train.sbatch pass it), refused naming the first job: the scenario of a workflow stage that SLURM requeued after a
  node failure while Snakemake submitted it again.

A rank that Lightning's launcher starts takes no lock: tests/core/test_run_dir_lock.py; the other 2-rank trainings of
the suite (e.g. test_train_resume_two_ranks.py) run under it.
"""
from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.ranks import local_launch_env
from tests.helpers.training import tiny_run_overrides

REPO_ROOT = Path(__file__).resolve().parents[2]
PARTIAL = Path("checkpoints") / ".checkpoint-step0000005.ckpt-x1y2.partial"    # as a save in progress leaves it

# A training that parks every rank at the start of its second step until <gate>/release exists.
HOLDER = """
import os, sys, time
import pytorch_lightning as pl
import torch
torch.set_num_threads(1)
from pipeline.core.app import compose
from pipeline.pretraining.run import train

gate = sys.argv[1]


class Park(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        release = os.path.join(gate, "release")
        if trainer.global_step == 1 and not os.path.exists(release):
            open(os.path.join(gate, f"parked-rank{trainer.global_rank}"), "w").close()
            deadline = time.monotonic() + 300
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.1)


train(compose("train", sys.argv[2:]), extra_callbacks=[Park()])
"""


def _overrides(shards: Path, run_dir: Path, *extra: str) -> list[str]:
    return tiny_run_overrides(shards, run_dir, 3, "export.hf=false", "export.plot=false", *extra)


def _wait_for(condition, timeout_s: float, what: str, show=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s} s\n{show()}")
        time.sleep(0.2)


def test_a_second_training_is_refused_naming_the_live_one(tmp_path, small_shards):
    from pipeline.core.app import compose
    from pipeline.pretraining.run import train

    run_dir, gate = tmp_path / "run", tmp_path / "gate"
    gate.mkdir()
    (tmp_path / "holder.py").write_text(HOLDER)
    log = open(tmp_path / "holder.log", "w")
    command = [sys.executable, str(tmp_path / "holder.py"), str(gate), *_overrides(small_shards, run_dir)]
    holder = subprocess.Popen(command, cwd=REPO_ROOT, env=local_launch_env(), stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        _wait_for(lambda: (gate / "parked-rank0").exists() or holder.poll() is not None, 240,
                  "the holder did not reach step 1", lambda: (tmp_path / "holder.log").read_text())
        assert holder.poll() is None, (tmp_path / "holder.log").read_text()[-5000:]
        (run_dir / PARTIAL).parent.mkdir(exist_ok=True)
        (run_dir / PARTIAL).write_bytes(b"half a checkpoint")
        with pytest.raises(RuntimeError, match=rf"run directory {run_dir} is in use by a trainer outside SLURM "
                                               rf"\(pid {holder.pid} on {socket.gethostname()}.*its process is alive"):
            train(compose("train", _overrides(small_shards, run_dir, "ckpt_path=auto")))
        assert (run_dir / PARTIAL).read_bytes() == b"half a checkpoint"
        (gate / "release").touch()
        assert holder.wait(timeout=240) == 0, (tmp_path / "holder.log").read_text()[-5000:]
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, 9)
            holder.wait()
        log.close()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert not (run_dir / ".trainer_lock.json").exists()          # released at its end


def test_on_slurm_a_second_job_is_refused_naming_the_job_that_holds_the_run_directory(slurm_cluster, tmp_path,
                                                                                     small_shards):
    run_dir, gate = tmp_path / "run", tmp_path / "gate"
    gate.mkdir()
    (tmp_path / "holder.py").write_text(HOLDER)
    env = {**slurm_cluster.env, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}

    def sbatch(name: str, command: list[str], tasks: int = 1) -> str:
        submitted = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", f"--ntasks-per-node={tasks}",
                                    "--cpus-per-task=1", f"--output={tmp_path}/{name}-%j.out", f"--chdir={REPO_ROOT}",
                                    "--wrap", shlex.join(["srun", *command] if tasks > 1 else command)],
                                   env=env, capture_output=True, text=True, check=True)
        return submitted.stdout.strip().split(";")[0]

    def log(name: str) -> str:
        return "\n".join(p.read_text(errors="replace") for p in tmp_path.glob(f"{name}-*.out"))

    first = sbatch("holder", [sys.executable, str(tmp_path / "holder.py"), str(gate),
                              *_overrides(small_shards, run_dir, "trainer.devices=2", "strategy=ddp")], tasks=2)
    try:
        _wait_for(lambda: all((gate / f"parked-rank{r}").exists() for r in (0, 1))
                  or slurm_cluster.job_field(first, "JobState") not in ("PENDING", "RUNNING"), 240,
                  "the holder's ranks did not reach step 1",
                  lambda: log("holder") + slurm_cluster.logs())
        assert slurm_cluster.job_field(first, "JobState") == "RUNNING", log("holder")
        (run_dir / PARTIAL).parent.mkdir(exist_ok=True)
        (run_dir / PARTIAL).write_bytes(b"half a checkpoint")
        second_overrides = [o for o in _overrides(small_shards, run_dir) if not o.startswith("output_dir=")]
        second = sbatch("second", [sys.executable, "pipeline/train.py", *second_overrides, f"hydra.run.dir={run_dir}",
                                   "ckpt_path=auto"])
        state = slurm_cluster.wait_for_job(second, 240)
        assert state == "FAILED" and f"run directory {run_dir} is in use by SLURM job {first}" in log("second") \
            and f"job {first} is RUNNING" in log("second"), (state, log("second"))
        assert (run_dir / PARTIAL).read_bytes() == b"half a checkpoint"
        (gate / "release").touch()
        assert slurm_cluster.wait_for_job(first, 240) == "COMPLETED", log("holder")
    finally:
        slurm_cluster.run("scancel", first)
    assert not (run_dir / ".trainer_lock.json").exists()
