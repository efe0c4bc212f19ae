"""The multi-rank tests' runner (tests/helpers/ranks.py): a group that hangs fails the test with the Python stack of
every process in it, the child that a rank started included, and leaves none of them running."""
from __future__ import annotations

import sys
import textwrap

import pytest

from tests.helpers.ranks import local_launch_env, run_rank_group

# A "rank 0" that starts a "rank 1" (as Lightning's launcher does) and waits for it; both hang in a named function.
HANGING = textwrap.dedent("""
    import os, subprocess, sys, time
    def rank_one_waits_forever():
        print(os.getpid(), flush=True)
        time.sleep(3600)
    def rank_zero_waits_for_its_child():
        child = subprocess.Popen([sys.executable, __file__, "child"])
        child.wait()
    if sys.argv[1:] == ["child"]:
        rank_one_waits_forever()
    else:
        print(os.getpid(), flush=True)
        rank_zero_waits_for_its_child()
""")


def test_a_hanging_group_fails_with_every_process_stack_and_is_killed(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANGING)
    with pytest.raises(pytest.fail.Exception) as failure:
        run_rank_group([sys.executable, str(script)], local_launch_env(), timeout_s=5)
    message = str(failure.value)
    assert "did not finish in 5 s" in message
    assert "rank_zero_waits_for_its_child" in message and "rank_one_waits_forever" in message
    pids = [int(line) for line in message.split("stdout:\n", 1)[1].split("\nstderr:", 1)[0].split()]
    assert len(pids) == 2
    assert not [pid for pid in pids if running(pid)]


def running(pid: int) -> bool:
    """Alive, not a zombie (an orphan waits to be reaped by whatever adopted it)."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_finished_group_returns_its_output_and_status(tmp_path):
    done = run_rank_group([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], local_launch_env(),
                          timeout_s=60)
    assert (done.returncode, done.stdout) == (3, "out\n")
