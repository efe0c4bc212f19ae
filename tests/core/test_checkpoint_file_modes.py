"""A run's checkpoints and records get the mode a plain write gives (0666 less the umask), so a project group can read
them, not mkstemp's 0600; a checkpoint the resuming user may not read stops the resume naming the file, instead of a
PermissionError from deep inside or, worse, a resume from an older checkpoint. (DeepSpeed's `latest`, written by 2
ranks: tests/core/test_checkpoint_retention_two_ranks.py.)

The tests run as root in CI, which reads any file: the reads that must fail run without CAP_DAC_OVERRIDE (setpriv)."""
from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.checkpoints.atomic_files import atomic_file, write_atomically
from tests.helpers.training import tiny_run_overrides

REPO_ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def as_a_user_without_read_override(command: list[str]) -> list[str]:
    """`command` as this user, but unable to read files its permission bits deny it (root: CAP_DAC_* dropped)."""
    if os.geteuid() != 0:
        return command
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run without root's file access")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *command]


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_atomic_writes_take_the_umask(tmp_path, mask, expected):
    with umask(mask):
        write_atomically(tmp_path / "record.json", "{}")
        with atomic_file(tmp_path / "sub" / "last.ckpt") as out:
            out.write(b"x")
    assert mode(tmp_path / "record.json") == expected
    assert mode(tmp_path / "sub" / "last.ckpt") == expected
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["last.ckpt", "record.json", "sub"]   # no temporary left


@pytest.fixture(scope="module")
def tiny_run(finished_tiny_run):
    """A 4-step run (checkpoints at steps 2 and 4, last.ckpt), written under umask 022: the session's
    (tests/conftest.py: tiny_run_overrides(small_shards, <run>, 4, "callbacks.checkpoint.every_n_train_steps=2",
    "export.hf=false", "export.plot=false")), read only."""
    return finished_tiny_run


def test_a_runs_checkpoints_are_readable_by_its_group(tiny_run):
    written = [tiny_run / "checkpoints" / name for name in ("last.ckpt", "step0000002.ckpt", "step0000004.ckpt")]
    written.append(tiny_run / "verified_shards.json")
    assert {path.name: oct(mode(path)) for path in written} == {path.name: oct(0o644) for path in written}


def test_an_unreadable_checkpoint_stops_the_resume_naming_it(tiny_run, small_shards, tmp_path):
    run = shutil.copytree(tiny_run, tmp_path / "run")
    last = run / "checkpoints" / "last.ckpt"
    last.chmod(0o200)        # as one written 0600 by another user looks to this one
    command = [sys.executable, "pipeline/train.py",
               *tiny_run_overrides(small_shards, run, 6, "callbacks.checkpoint.every_n_train_steps=2",
                                   "export.hf=false", "export.plot=false", "ckpt_path=auto")]
    resumed = subprocess.run(as_a_user_without_read_override(command), cwd=REPO_ROOT, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=300)
    assert resumed.returncode == 2, "resumed from an older checkpoint, passing over the unreadable newest"
    assert resumed.stderr.startswith(f"cannot read {last}: whether the run's checkpoints are complete"), \
        resumed.stderr[-3000:]        # the refusal alone (pipeline.core.app.refused): no traceback above it
    assert not (run / "checkpoints" / "step0000006.ckpt").exists()


def test_an_unreadable_deepspeed_latest_is_named_by_the_resume_check(tmp_path):
    """infra/slurm/train.sbatch asks `python -m pipeline.core.checkpoints.checkpoint_files` for the run's newest
    checkpoint."""
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    (checkpoint / "global_step4").mkdir(parents=True)
    (checkpoint / "latest").write_text("global_step4")
    (checkpoint / "latest").chmod(0o200)
    command = [sys.executable, "-m", "pipeline.core.checkpoints.checkpoint_files", str(tmp_path / "run")]
    found = subprocess.run(as_a_user_without_read_override(command), cwd=REPO_ROOT, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=120)
    assert found.returncode == 2, found.stderr[-3000:]
    assert found.stderr.startswith(f"cannot read {checkpoint / 'latest'}: "), found.stderr[-3000:]
    assert "Traceback" not in found.stderr


def test_an_unreadable_checkpoint_given_as_ckpt_path_is_named(tiny_run, tmp_path):
    """ckpt_path=<file>: Lightning's restore reads it through the pipeline's checkpoint IO."""
    last = Path(shutil.copy(tiny_run / "checkpoints" / "last.ckpt", tmp_path / "last.ckpt"))
    last.chmod(0o200)
    load = ("from pipeline.core.checkpoints.lightning_checkpoints import AtomicCheckpointIO; "
            f"AtomicCheckpointIO().load_checkpoint({str(last)!r})")
    loaded = subprocess.run(as_a_user_without_read_override([sys.executable, "-c", load]), cwd=REPO_ROOT,
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                            timeout=120)
    assert loaded.returncode == 1
    assert loaded.stderr.strip().splitlines()[-1].startswith(
        f"pipeline.core.checkpoints.checkpoint_files.UnreadableCheckpoint: cannot read {last}: "), loaded.stderr[-3000:]
