"""One launch at a time on a workflow root.

- <root>/_workflow/launch.lock: an exclusive lock (flock) held by whatever runs or submits the workflow: a local run
  for its whole length, a SLURM launch while it submits the controller job, the controller job while it runs.
- <root>/_workflow/controller.json: who holds it or held it last (local: host and pid; SLURM: the controller's job
  id), so that a second launch can say what is running, and so that a SLURM controller job, which holds no lock while
  it waits in the queue, still counts as running (asked of squeue; a failing squeue refuses the launch).
- Snakemake's own lock (<root>/.snakemake/locks) stays as the last line. A controller that was killed leaves it
  behind; it is released once the record above shows that no controller is alive.
"""
from __future__ import annotations

import fcntl
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

from pipeline.orchestration import runs
from pipeline.orchestration.spec import Workflow, WorkflowError
from pipeline.orchestration.slurm_jobs import QueueError, job_state

LOCK_FILE = "launch.lock"
CONTROLLER_FILE = "controller.json"
ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED",
                 "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED")


class LaunchLock:
    """The exclusive lock of a workflow root; `describe()` says who holds it."""

    def __init__(self, workflow: Workflow):
        self.workflow = workflow
        self.path = workflow.state_dir / LOCK_FILE
        self.handle = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise WorkflowError(already_running(self.workflow, "it holds the launch lock")) from None
        self.handle = handle

    def release(self) -> None:
        if self.handle is not None:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None

    def __enter__(self) -> "LaunchLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def controller_record(workflow: Workflow) -> dict[str, Any] | None:
    return runs.read_json(workflow.state_dir / CONTROLLER_FILE)


def write_controller_record(wf: Workflow, **fields: Any) -> dict[str, Any]:
    record = {"workflow": wf.name, "root": str(wf.root), **fields}
    runs.write_json(wf.state_dir / CONTROLLER_FILE, record)
    return record


def describe(record: dict[str, Any] | None) -> str:
    if not record:
        return "a launch that left no record"
    if record.get("kind") == "slurm":
        return (f"SLURM controller job {record.get('job_id')} (submitted {record.get('submitted')}, log "
                f"{record.get('log')})")
    return f"a local run, pid {record.get('pid')} on {record.get('host')} since {record.get('started')}"


def already_running(workflow: Workflow, why: str) -> str:
    return (f"workflow {workflow.name} in {workflow.root} is already running: {describe(controller_record(workflow))}"
            f" ({why}). Wait for it, or stop it (Ctrl-C, or scancel the controller job) and launch again.")


def check_no_live_controller(workflow: Workflow) -> None:
    """Called with the launch lock held: refuse when the last controller may still be alive."""
    record = controller_record(workflow)
    if not record or record.get("ended"):
        return
    if record.get("kind") == "slurm" and record.get("job_id"):
        try:
            state = job_state(str(record["job_id"]))
        except QueueError as error:
            raise WorkflowError(f"cannot tell whether controller job {record['job_id']} of workflow "
                                f"{workflow.name} still runs ({error}); not launching a second one") from None
        if state in ACTIVE_STATES:
            raise WorkflowError(already_running(workflow, f"job {record['job_id']} is {state}"))
        return
    if record.get("host") == socket.gethostname() and _process_alive(record.get("pid")):
        raise WorkflowError(already_running(workflow, "its process is alive"))
    if record.get("host") != socket.gethostname():
        raise WorkflowError(already_running(workflow, f"it ran on another host, {record.get('host')}, whose "
                                                      "processes cannot be seen from here; if it is gone, remove "
                                                      f"{workflow.state_dir / CONTROLLER_FILE}"))


def _process_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, TypeError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def refuse_if_running(workflow: Workflow) -> None:
    """Say at once, before minutes of composing and checking, that another launch holds this root."""
    with LaunchLock(workflow):
        check_no_live_controller(workflow)


def release_stale_snakemake_lock(workflow: Workflow, args: list[str], env: dict[str, str]) -> None:
    """A killed controller leaves Snakemake's lock behind; with ours held and no controller alive it is stale."""
    locks = workflow.root / ".snakemake" / "locks"
    if locks.is_dir() and any(locks.iterdir()):
        subprocess.run([*args, "--unlock"], env=env, capture_output=True, text=True, check=True)
