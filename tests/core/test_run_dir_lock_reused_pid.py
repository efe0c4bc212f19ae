"""The trainer's lock (pipeline/core/cluster/run_dir_lock.py) when the pid it names has been reused (issue 49, item 6):
a live process under that pid that started at another time than the holder recorded is not the holder, and its lock is
taken over, saying so; the holder itself, and a lock of the code before start times were recorded, are refused while
that pid lives. Start times are read from /proc here, not through the code under test."""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
from pathlib import Path

import pytest

from pipeline.core.cluster.run_dir_lock import LOCK_NAME, RunDirInUse, RunDirLock, hold_run_dir

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process start times come from /proc")
LAUNCHERS = ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_PROCID", "RANK", "LOCAL_RANK", "NODE_RANK")


@pytest.fixture(autouse=True)
def _outside_any_launcher(monkeypatch):
    for name in LAUNCHERS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def sleeper():
    """An unrelated live process: what a reused pid points at."""
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def _start_of(pid: int) -> str:
    """Field 22 of /proc/PID/stat: the start in clock ticks since boot."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def _held_by(run_dir: Path, **holder) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LOCK_NAME).write_text(json.dumps(holder))


def _earlier(start: str) -> str:
    return str(int(start) - 1)


def test_a_live_process_that_is_not_the_recorded_holder_is_taken_over_with_a_log_line(tmp_path, sleeper, caplog):
    _held_by(tmp_path, host=socket.gethostname(), pid=sleeper.pid, process_start=_earlier(_start_of(sleeper.pid)),
             started="earlier")
    caplog.set_level(logging.INFO, logger="pipeline.core.cluster.run_dir_lock")
    with hold_run_dir(tmp_path):
        held = json.loads((tmp_path / LOCK_NAME).read_text())
        assert held["pid"] == os.getpid() and held["process_start"] == _start_of(os.getpid())
    assert sleeper.poll() is None                       # the unrelated process is left alone
    assert f"took over {tmp_path / LOCK_NAME} from a trainer outside SLURM (pid {sleeper.pid}" in caplog.text
    assert f"pid {sleeper.pid} is now another process" in caplog.text


def test_a_restarted_container_whose_pid_the_old_lock_names_takes_it_over(tmp_path):
    """A container's trainer is pid 1 at every start: the lock of the start before names this very pid."""
    _held_by(tmp_path, host=socket.gethostname(), pid=os.getpid(), process_start=_earlier(_start_of(os.getpid())),
             started="earlier")
    with hold_run_dir(tmp_path):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["process_start"] == _start_of(os.getpid())


def test_the_recorded_holder_itself_is_still_refused(tmp_path, sleeper):
    _held_by(tmp_path, host=socket.gethostname(), pid=sleeper.pid, process_start=_start_of(sleeper.pid),
             started="earlier")
    with pytest.raises(RunDirInUse, match=rf"pid {sleeper.pid} on .*its process is alive.*kill {sleeper.pid}"):
        RunDirLock(tmp_path).acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == sleeper.pid


def test_a_lock_without_a_start_time_is_refused_while_its_pid_lives(tmp_path, sleeper):
    """Written by the code before start times were recorded: any live process under its pid counts, as then."""
    _held_by(tmp_path, host=socket.gethostname(), pid=sleeper.pid, started="earlier")
    with pytest.raises(RunDirInUse, match=rf"pid {sleeper.pid} on .*its process is alive"):
        RunDirLock(tmp_path).acquire()
    sleeper.kill()
    sleeper.wait()
    with hold_run_dir(tmp_path):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
