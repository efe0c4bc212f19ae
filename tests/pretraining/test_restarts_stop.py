"""Stopping pipeline/core/cluster/restarts.py stops its training (issue 49, item 11). A SIGTERM or SIGINT sent to the
supervisor (train.sbatch's batch shell execs it: `scancel --batch`, `kill <pid>`, Ctrl-C) is passed on to the running
try, which stops as on its own (exit 143 or 130, its run directory's lock released); the supervisor waits for it,
starts no other try and exits with its status. A SIGKILL, which the supervisor cannot catch, still stops the try (the
kernel's parent-death signal, a SIGTERM) instead of leaving it training, orphaned, holding the run directory.

`python -m pipeline.core.cluster.restarts <run dir> -- python pipeline/train.py ...` as train.sbatch runs it (without
srun), on a tiny run of 400 steps, signalled once its step-5 checkpoint is on disk. A training signalled itself:
tests/pretraining/test_train_sigterm.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.cluster.run_dir_lock import LOCK_NAME, RunDirLock

REPO_ROOT = Path(__file__).resolve().parents[2]


def supervise(run_dir: Path, log: Path, overrides: list[str]) -> subprocess.Popen:
    """In a process group of its own, as a terminal's foreground job: a Ctrl-C reaches every process in it."""
    training = [sys.executable, "pipeline/train.py", *overrides, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT), "WANDB_MODE": "disabled"}
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "pipeline.core.cluster.restarts", str(run_dir), "--", *training],
                                cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, process_group=0)


def training_of(supervisor: subprocess.Popen, run_dir: Path, log: Path, timeout: float = 300) -> int:
    """The pid of the supervisor's training, once the run's step-5 checkpoint is on disk."""
    deadline = time.monotonic() + timeout
    while not (run_dir / "checkpoints" / "step0000005.ckpt").exists():
        assert supervisor.poll() is None, f"exited {supervisor.returncode} before step 5:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no step-5 checkpoint after {timeout} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)
    children = Path(f"/proc/{supervisor.pid}/task/{supervisor.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not yet reaped by whoever adopted it, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def ends_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def stop_all(supervisor: subprocess.Popen, training: int | None) -> None:
    """Whatever the test left running (the old code leaves the training running after its supervisor ended)."""
    supervisor.kill()
    supervisor.wait()
    if training is not None and running(training):
        os.kill(training, signal.SIGKILL)


def assert_run_directory_free(run_dir: Path) -> None:
    assert not (run_dir / LOCK_NAME).exists(), (run_dir / LOCK_NAME).read_text()
    lock = RunDirLock(run_dir)            # a new trainer there takes it
    lock.acquire()
    lock.release()


@pytest.mark.slow
@pytest.mark.parametrize("stop, to_the_group", [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGINT, True)],
                         ids=["SIGTERM", "SIGINT", "Ctrl-C"])
def test_a_stop_sent_to_restarts_stops_its_training_and_frees_the_run_directory(stop, to_the_group, small_shards,
                                                                                tmp_path, tiny_overrides):
    """Ctrl-C: the terminal's SIGINT to the whole group, the training included, which then gets it twice."""
    run_dir, log = tmp_path / "run", tmp_path / "restarts.log"
    supervisor, training = supervise(run_dir, log, tiny_overrides(small_shards, run_dir, 400)), None
    try:
        training = training_of(supervisor, run_dir, log)
        if to_the_group:
            os.killpg(supervisor.pid, stop)
        else:
            supervisor.send_signal(stop)
        try:
            code = supervisor.wait(timeout=120)
        except subprocess.TimeoutExpired:
            code = "still running after 120 s"
        training_ended = ends_within(training, 10)
    finally:
        stop_all(supervisor, training)
    output = log.read_text()
    print(f"restarts.py after its {stop.name}: exit status {code}; its training "
          f"{'ended' if training_ended else 'still ran, orphaned'}; lock file left: {(run_dir / LOCK_NAME).exists()}")
    assert training_ended, output[-4000:]
    assert code == 128 + stop, output[-4000:]
    assert f"try 1 was stopped ({stop.name}, passed on from this supervisor; it ended with exit status " \
           f"{128 + stop}): not started again" in output, output[-4000:]
    assert "try 2" not in output
    assert_run_directory_free(run_dir)


@pytest.mark.slow
def test_a_sigkill_of_restarts_still_stops_its_training_and_frees_the_run_directory(small_shards, tmp_path,
                                                                                   tiny_overrides):
    run_dir, log = tmp_path / "run", tmp_path / "restarts.log"
    supervisor, training = supervise(run_dir, log, tiny_overrides(small_shards, run_dir, 400)), None
    try:
        training = training_of(supervisor, run_dir, log)
        supervisor.kill()                   # uncatchable: nothing in restarts.py runs after it
        supervisor.wait()
        training_ended = ends_within(training, 30)
    finally:
        stop_all(supervisor, training)
    print(f"restarts.py killed: its training {'ended' if training_ended else 'still ran, orphaned'} within 30 s; "
          f"lock file left: {(run_dir / LOCK_NAME).exists()}")
    assert training_ended, log.read_text()[-4000:]
    assert_run_directory_free(run_dir)      # the training stopped on a SIGTERM, released it; a SIGKILL would not
