"""One launch at a time on a workflow root, with a lock that needs no flock (Lustre mounted noflock raises on it; NFS
nolock and localflock lock one node only): a file created exclusively, naming its holder. A holder that is gone is
taken over; one that cannot be checked is refused with the file to remove. The root is resolved before it names
the SLURM jobs, so a path through a link names the same jobs."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import subprocess

import pytest

from pipeline.orchestration.launch import job_name_prefix
from pipeline.orchestration.lock import LaunchLock
from pipeline.orchestration.workflow_config import WorkflowError, load_workflow


@pytest.fixture
def workflow(tmp_path, monkeypatch):
    def no_flock(*_args):                     # as on a Lustre client mounted noflock
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.setattr(fcntl, "lockf", no_flock)
    return load_workflow(["+workflow=tiny", f"workflow.root={tmp_path / 'wf'}"])


def _held_by(workflow, **holder) -> None:
    workflow.state_dir.mkdir(parents=True, exist_ok=True)
    (workflow.state_dir / "lock.json").write_text(json.dumps(holder))


def test_the_lock_excludes_a_second_launch_without_flock(workflow):
    with LaunchLock(workflow):
        with pytest.raises(WorkflowError, match=f"already running: a local run, pid {os.getpid()} .*its process is "
                                                "alive"):
            LaunchLock(workflow).acquire()
    LaunchLock(workflow).acquire()            # released: the next launch takes it


def test_a_dead_holder_on_this_host_is_taken_over(workflow, capsys):
    gone = subprocess.Popen(["true"])
    gone.wait()
    _held_by(workflow, host=socket.gethostname(), pid=gone.pid, started="earlier")
    lock = LaunchLock(workflow)
    lock.acquire()
    assert lock.took_over and lock.holder()["pid"] == os.getpid()
    assert f"taking over the lock of a local run, pid {gone.pid}" in capsys.readouterr().out


def test_a_holder_that_cannot_be_checked_is_refused_saying_which_file_to_remove(workflow, monkeypatch, tmp_path):
    lock_file = workflow.state_dir / "lock.json"
    _held_by(workflow, host="another-node", pid=1, started="earlier")
    with pytest.raises(WorkflowError, match=f"cannot be seen from this host; if it is gone, remove {lock_file}"):
        LaunchLock(workflow).acquire()
    _held_by(workflow, job_id="1234", submitted="earlier")
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    with pytest.raises(WorkflowError, match=f"SLURM cannot tell .*squeue is not on the PATH.*remove {lock_file}"):
        LaunchLock(workflow).acquire()


def test_job_names_hash_the_resolved_root(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    through_link = load_workflow(["+workflow=tiny", f"workflow.root={tmp_path / 'link' / 'wf'}"])
    real = load_workflow(["+workflow=tiny", f"workflow.root={tmp_path / 'real' / 'wf'}"])
    assert job_name_prefix(through_link.name, through_link.root) == job_name_prefix(real.name, real.root)
