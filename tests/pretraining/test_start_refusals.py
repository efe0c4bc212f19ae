"""A run refused before it starts says why once, in one message, and exits with 2, which nothing starts again (issue
49, item 13): not a traceback under Hydra's "Error executing job", not the name of a temporary file, not the same
message twice. `python pipeline/train.py`, `python -m pipeline.core.cluster.restarts` and infra/slurm/train.sbatch (with
a stand-in srun) as users run them, on a finished tiny run:

- a run directory this user may not write is refused naming it (the tests run as root in CI, which writes anywhere:
  the trainer runs without CAP_DAC_OVERRIDE, through setpriv, as tests/core/test_checkpoint_file_modes.py reads);
- a checkpoint this user may not read is named once, whichever of the three meets it first;
- a resume that changes what shapes the run prints the refusal alone, and restarts.py does not start it again.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.cluster.run_dir_lock import LOCK_NAME
from tests.core.test_checkpoint_file_modes import as_a_user_without_read_override
from tests.helpers.training import tiny_run_overrides

REPO_ROOT = Path(__file__).resolve().parents[2]
REFUSED = 2
EXTRA = ("callbacks.checkpoint.every_n_train_steps=2", "export.hf=false", "export.plot=false")


@pytest.fixture(scope="module")
def finished_run(finished_tiny_run) -> Path:
    """A finished 4-step run: checkpoints at steps 2 and 4, last.ckpt, its config record (the session's, read only:
    tiny_run_overrides(small_shards, <run>, 4, *EXTRA), tests/conftest.py)."""
    return finished_tiny_run


def run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", **env})


def training(shards: Path, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "pipeline/train.py", *tiny_run_overrides(shards, run_dir, 4, *EXTRA, *extra),
            f"hydra.run.dir={run_dir}"]


def assert_message_alone(done: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in done.stderr and "Error executing job" not in done.stderr, done.stderr[-3000:]


def test_a_run_directory_it_may_not_write_is_refused_naming_it(small_shards, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)        # as an earlier start left it: Hydra's files stay writable
    (run_dir / "train.log").touch()
    run_dir.chmod(0o555)
    try:
        done = run(as_a_user_without_read_override(training(small_shards, run_dir)))
    finally:
        run_dir.chmod(0o755)
    print(f"exit status {done.returncode}; stderr ends: {done.stderr[-600:]}")
    assert done.returncode == REFUSED, done.stderr[-3000:]
    assert done.stderr.startswith(f"run directory {run_dir} is not writable (Permission denied): a trainer writes "
                                  f"its lock ({LOCK_NAME}), checkpoints and logs there"), done.stderr[-3000:]
    assert f"{LOCK_NAME}.new" not in done.stderr
    assert_message_alone(done)


def train_sbatch(run_dir: Path, tmp_path: Path, *args: str) -> list[str]:
    """infra/slurm/train.sbatch under bash as a 1-node job, with a stand-in srun that only notes that it ran."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    (fake_bin / "srun").write_text(f'#!/bin/sh\ntouch {tmp_path / "srun_ran"}\n')
    (fake_bin / "srun").chmod(0o755)
    slurm = {"PATH": f"{fake_bin}:{os.environ['PATH']}", "RUN_DIR": str(run_dir), "SLURM_SUBMIT_DIR": str(REPO_ROOT),
             "SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "bert-pretrain", "SLURM_NNODES": "1",
             "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NODELIST": "localhost"}
    return ["env", *(f"{key}={value}" for key, value in slurm.items()), "bash",
            str(REPO_ROOT / "infra" / "slurm" / "train.sbatch"), *args]


@pytest.mark.parametrize("launch", ["train.py", "train.sbatch", "train.sbatch ckpt_path=<another checkpoint>"])
def test_a_checkpoint_it_may_not_read_is_named_once(launch, finished_run, small_shards, tmp_path):
    run_dir = shutil.copytree(finished_run, tmp_path / "run")
    last = run_dir / "checkpoints" / "last.ckpt"
    last.chmod(0o200)        # as one written 0600 by another user looks to this one
    if launch == "train.py":
        command = training(small_shards, run_dir, "ckpt_path=auto")
    else:
        given = ["ckpt_path=/elsewhere/last.ckpt"] if "ckpt_path" in launch else []
        command = train_sbatch(run_dir, tmp_path, *given)
    done = run(as_a_user_without_read_override(command))
    output = done.stdout + done.stderr
    print(f"{launch}: exit status {done.returncode}; 'cannot read {last}' printed {output.count(f'cannot read {last}')}"
          f" times; traceback: {'Traceback' in output}")
    assert output.count(f"cannot read {last}: whether the run's checkpoints are complete") == 1, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    assert done.returncode == REFUSED, output[-4000:]
    assert not (tmp_path / "srun_ran").exists()


def test_a_refused_resume_prints_the_refusal_alone_and_is_not_started_again(finished_run, small_shards, tmp_path):
    run_dir = shutil.copytree(finished_run, tmp_path / "run")
    resume = training(small_shards, run_dir, "ckpt_path=last", "optimizer.lr=0.0002")
    refusal = f"this config changes what shapes the run since {run_dir / 'run_config.json'} recorded it"

    done = run(resume)
    print(f"train.py: exit status {done.returncode}; stderr ends: {done.stderr[-800:]}")
    assert done.returncode == REFUSED, done.stderr[-3000:]
    assert f"resuming {run_dir / 'checkpoints' / 'last.ckpt'}: {refusal}" in done.stderr
    assert "optimizer.lr: 0.001 -> 0.0002" in done.stderr
    assert_message_alone(done)

    supervised = run([sys.executable, "-m", "pipeline.core.cluster.restarts", str(run_dir), "--", *resume])
    output = supervised.stdout + supervised.stderr
    print(f"restarts.py: exit status {supervised.returncode}; stdout: {supervised.stdout[-600:]}")
    assert supervised.returncode == REFUSED, output[-3000:]
    assert output.count(refusal) == 1, output[-3000:]          # one try
    assert "try 1 refused to start (exit status 2, the reason above): not started again" in supervised.stdout
