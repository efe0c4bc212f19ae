"""A training stopped by SIGTERM (`kill <pid>`, which the run-directory lock's refusal suggests; `scancel
--signal=TERM`; a container's eviction) exits 143, 128 + SIGTERM, never 0: nothing that runs it (pipeline/core/
restarts.py, the workflow's stage runner) may take the unfinished run as finished. `python pipeline/train.py` as
users run it, on a tiny run of 400 steps, receiving a real SIGTERM from outside once its step-5 checkpoint is on disk.
The workflow's stage: tests/orchestration/test_stage_sigterm.py. The SIGTERM that SLURM sends after a requeue still
ends the run as requeued, with REQUEUED_EXIT_CODE (the real SLURM: tests/pretraining/test_slurm_requeue.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.app import REPO_ROOT
from pipeline.core.cluster.requeue import REQUEUED_EXIT_CODE

STOPPED = 128 + signal.SIGTERM


def start(command: list[str], log: Path, **extra_env: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT), "WANDB_MODE": "disabled", **extra_env}
    with open(log, "wb") as out:
        return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def training_command(shards: Path, run_dir: Path, tiny_overrides) -> list[str]:
    return [sys.executable, "pipeline/train.py", *tiny_overrides(shards, run_dir, 400), f"hydra.run.dir={run_dir}"]


def wait_for(path: Path, process: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"exited {process.returncode} before {path}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)


def sigterm_after_step_5(training: subprocess.Popen, run_dir: Path, log: Path) -> int:
    """SIGTERM to the training once its step-5 checkpoint is on disk; its exit status."""
    try:
        wait_for(run_dir / "checkpoints" / "step0000005.ckpt", training, log)
        training.send_signal(signal.SIGTERM)
        return training.wait(timeout=120)
    finally:
        training.kill()


def assert_stopped_unfinished(run_dir: Path) -> None:
    assert not (run_dir / "hf_export").exists()    # the export of a finished run only
    import torch

    last = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] < 400


@pytest.mark.slow
def test_a_training_stopped_by_sigterm_exits_143(small_shards, tmp_path, tiny_overrides):
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    training = start(training_command(small_shards, run_dir, tiny_overrides), log)
    code = sigterm_after_step_5(training, run_dir, log)
    print(f"train.py exit status after SIGTERM: {code}")
    assert code == STOPPED, log.read_text()[-4000:]
    assert_stopped_unfinished(run_dir)


@pytest.mark.slow
def test_restarts_passes_on_a_training_stopped_by_sigterm(small_shards, tmp_path, tiny_overrides):
    """As train.sbatch and the workflow run it: the wrapper neither starts the try again nor reports success."""
    run_dir, log = tmp_path / "run", tmp_path / "restarts.log"
    wrapper = start([sys.executable, "-m", "pipeline.core.cluster.restarts", str(run_dir), "--",
                     *training_command(small_shards, run_dir, tiny_overrides)], log)
    try:
        wait_for(run_dir / "checkpoints" / "step0000005.ckpt", wrapper, log)
        children = Path(f"/proc/{wrapper.pid}/task/{wrapper.pid}/children").read_text().split()
        assert len(children) == 1, children
        os.kill(int(children[0]), signal.SIGTERM)     # the trainer's pid, as `kill <pid>` from the lock's message
        code = wrapper.wait(timeout=120)
    finally:
        wrapper.kill()
    output = log.read_text()
    print(f"restarts.py exit status after its training's SIGTERM: {code}")
    assert code == STOPPED, output[-4000:]
    assert "try 1 was stopped (SIGTERM): not started again" in output
    assert_stopped_unfinished(run_dir)


# `scontrol requeue <job>` as SLURM answers it: the job is requeued, and every process of its step gets SIGTERM.
SCONTROL = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/requeued"
kill -TERM $PPID
"""


@pytest.mark.slow
def test_the_sigterm_after_a_requeue_still_ends_the_run_as_requeued(small_shards, tmp_path, tiny_overrides):
    bin_dir, run_dir, log = tmp_path / "bin", tmp_path / "run", tmp_path / "train.log"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    slurm = {"SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
             "SLURM_NODEID": "0", "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "pretrain", "SLURM_NODELIST": "localhost"}
    training = start(training_command(small_shards, run_dir, tiny_overrides), log,
                     PATH=f"{bin_dir}:{os.environ['PATH']}", **slurm)
    try:
        wait_for(run_dir / "checkpoints" / "step0000005.ckpt", training, log)
        training.send_signal(signal.SIGUSR1)          # the requeue signal (pipeline/core/cluster/requeue.py)
        code = training.wait(timeout=120)
    finally:
        training.kill()
    print(f"train.py exit status after the requeue and its SIGTERM: {code}")
    assert code == REQUEUED_EXIT_CODE, log.read_text()[-4000:]
    assert (bin_dir / "requeued").read_text().split() == ["requeue", "4242"]


@pytest.mark.slow
def test_a_run_stopped_by_sigterm_is_not_finished_in_wandb(small_shards, tmp_path, tiny_overrides):
    """W&B shows a run by the exit code it was closed with: ca8c0b7 closed a SIGTERMed run with 0 ("finished"); now
    with 143, the process's own. W&B offline, its transaction log read back."""
    pytest.importorskip("wandb")
    from tests.helpers.wandb_log import read_wandb_records

    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    (tmp_path / "wandb_config").mkdir()
    command = [*training_command(small_shards, run_dir, tiny_overrides), "logger=wandb_offline"]
    training = start(command, log, WANDB_MODE="offline", WANDB_CONFIG_DIR=str(tmp_path / "wandb_config"))
    code = sigterm_after_step_5(training, run_dir, log)
    assert code == STOPPED, log.read_text()[-4000:]
    runs = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, sorted(str(p) for p in (run_dir / "wandb").rglob("*"))
    exits = [r.exit.exit_code for r in read_wandb_records(runs[0]) if r.WhichOneof("record_type") == "exit"]
    print(f"W&B exit records of the SIGTERMed run: {exits}")
    assert exits == [STOPPED]
