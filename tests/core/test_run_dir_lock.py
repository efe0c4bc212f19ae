"""The run directory's lock (pipeline/core/cluster/run_dir_lock.py) with real processes and files, no training: who
takes it over and who is refused. A training refused by it: tests/pretraining/test_one_trainer_per_run_dir.py."""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys

import pytest

from pipeline.core.cluster.run_dir_lock import LOCK_NAME, RunDirInUse, RunDirLock, hold_run_dir

LAUNCHERS = ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_PROCID", "RANK", "LOCAL_RANK", "NODE_RANK")


@pytest.fixture(autouse=True)
def _outside_any_launcher(monkeypatch):
    for name in LAUNCHERS:
        monkeypatch.delenv(name, raising=False)


def _held_by(run_dir, **holder) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LOCK_NAME).write_text(json.dumps(holder))


def _ended_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def test_a_live_process_holds_it_and_a_dead_ones_lock_is_taken_over(tmp_path, caplog):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _held_by(tmp_path, host=socket.gethostname(), pid=holder.pid, started="earlier")
        with pytest.raises(RunDirInUse, match=rf"in use by a trainer outside SLURM \(pid {holder.pid} on "
                                              rf"{socket.gethostname()}.*its process is alive"):
            RunDirLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    caplog.set_level(logging.INFO, logger="pipeline.core.cluster.run_dir_lock")
    with hold_run_dir(tmp_path):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
        assert f"pid {holder.pid} on {socket.gethostname()}" in caplog.text and "it is gone" in caplog.text
    assert not (tmp_path / LOCK_NAME).exists()          # released at the end


def test_a_holder_that_cannot_be_checked_is_refused_saying_which_file_to_remove(tmp_path, monkeypatch):
    _held_by(tmp_path, host="another-node", pid=1, started="earlier")
    with pytest.raises(RunDirInUse, match=f"cannot be seen from this host. If that trainer is gone, remove "
                                          f"{tmp_path / LOCK_NAME}"):
        RunDirLock(tmp_path).acquire()
    _held_by(tmp_path, job_id="1234", restart=0, host="another-node", pid=1, started="earlier")
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    with pytest.raises(RunDirInUse, match=rf"in use by SLURM job 1234 .*SLURM cannot tell .*squeue is not on the "
                                          rf"PATH.*remove {tmp_path / LOCK_NAME}"):
        RunDirLock(tmp_path).acquire()


def test_the_same_job_is_the_same_trainer_unless_another_of_its_processes_lives_here(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))   # the job's own lock: nothing to ask SLURM
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    _held_by(tmp_path, job_id="77", restart=0, host="node-that-failed", pid=1, started="earlier")    # requeued
    lock = RunDirLock(tmp_path)
    lock.acquire()
    lock.keep = True                                  # stopped to be requeued: the next start finds it
    lock.release()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["restart"] == 1
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _held_by(tmp_path, job_id="77", restart=1, host=socket.gethostname(), pid=other.pid, started="earlier")
        with pytest.raises(RunDirInUse, match="in use by SLURM job 77"):
            RunDirLock(tmp_path).acquire()              # a second trainer inside the same job
    finally:
        other.kill()
        other.wait()


def test_only_the_first_process_takes_it_and_a_lock_not_its_own_is_left(tmp_path, monkeypatch):
    _held_by(tmp_path, host="another-node", pid=1, started="earlier")
    monkeypatch.setenv("LOCAL_RANK", "1")               # rank 1, started by rank 0's launcher: holds nothing
    with hold_run_dir(tmp_path):
        pass
    monkeypatch.delenv("LOCAL_RANK")
    assert json.loads((tmp_path / LOCK_NAME).read_text())["host"] == "another-node"
    (tmp_path / LOCK_NAME).unlink()
    lock = RunDirLock(tmp_path)
    lock.acquire()
    _held_by(tmp_path, host="another-node", pid=2, started="later")    # removed by hand and taken by another
    lock.release()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == 2
