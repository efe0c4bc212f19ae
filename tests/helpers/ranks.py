"""Runs of several ranks on this machine, as the tests start them: one command whose Lightning starts the other ranks
(and each rank its loader workers), all in one process group of their own.

- `local_launch_env()`: the environment of a fresh local launch. Without SLURM's and a launcher's variables, which
  would make Lightning join a job (the test session's own, or the SLURM tests' beside it) instead of starting its own
  ranks; with Python's faulthandler on in every process.
- `run_rank_group()`: the command, bounded in time. A hang that does not end by itself (a collective that one rank
  never enters, a loader worker that never answers) would otherwise show nothing but a timeout; here every process of
  the group first prints each of its threads' Python stack (SIGABRT, which faulthandler answers), and the failure
  shows them.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCHER_VARS = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")
STACKS_GRACE_S = 30     # for every process to print its stacks after the SIGABRT
KILL_GRACE_S = 30       # for the kernel to end every process of the group after the SIGKILL


def local_launch_env(**extra: str) -> dict[str, str]:
    """os.environ less SLURM_* and the launcher variables; the repository first on PYTHONPATH, one thread per rank,
    unbuffered output, faulthandler on; then `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in LAUNCHER_VARS}
    env.update(PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    env.update(extra)
    return env


def run_rank_group(command: list[str], env: dict[str, str], timeout_s: float,
                   cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    """Runs `command` in a new session; its output as text. Past `timeout_s`, fails the test with the Python stacks of
    every process of the session (the hang's where), then kills them all."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGABRT)
        try:
            stdout, stderr = proc.communicate(timeout=STACKS_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        _signal_group(proc.pid, signal.SIGKILL)    # any process that outlived the SIGABRT (one blocking it)
        _wait_until_gone(proc.pid)
        # Whole, in a file: the stacks of every rank and loader worker together outrun what a failure message keeps
        # (a CI hang of 2026-11-29 lost its ranks' own stacks behind their workers')
        kept = Path(tempfile.mkdtemp(prefix="rank-group-timeout-")) / "output.txt"
        kept.write_text(f"command: {command}\n\nstdout:\n{stdout}\n\nstderr:\n{stderr}")
        pytest.fail(f"{' '.join(command[:2])} did not finish in {timeout_s:.0f} s; each process's stacks then "
                    f"(faulthandler, on SIGABRT) are in its stderr, all of it in {kept}.\nstdout:\n{stdout[-3000:]}\n"
                    f"stderr:\n{stderr[-20000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass     # every process of the group has exited


def _wait_until_gone(pgid: int) -> None:
    """Returns once no live process is left in group `pgid` (a zombie has ended). Neither the end of the output nor
    kill() says that: a dying process closes its files before it ends, and kill() returns before its target has
    ended, so on a loaded machine a rank could still be seen running for a moment after both."""
    deadline = time.monotonic() + KILL_GRACE_S
    while (alive := _live_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive:
        raise RuntimeError(f"processes {alive} of group {pgid} still run {KILL_GRACE_S} s after SIGKILL")


def _live_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue     # ended while we looked
        state, process_group = fields[0], int(fields[2])
        if process_group == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members
