"""One launch at a time on a workflow root: <root>/_workflow/lock.json, created exclusively (O_EXCL: atomic on local
disks, NFS, Lustre and GPFS alike, where flock may be missing or lock one node only), names its holder: a local run
(host, pid) for its whole length; for SLURM the launching process, then the controller job (its id) while it waits in
the queue, runs and is requeued. A second launch is refused, naming the holder, unless the holder is gone (a dead
process on this host, a job SLURM no longer runs): then it is taken over, and the caller releases Snakemake's own
lock, which the dead holder left. When that cannot be told, the refusal says which file to remove."""
from __future__ import annotations

import json
import os
import socket
from typing import Any

from pipeline.orchestration import runs
from pipeline.orchestration.slurm import ACTIVE_STATES, QueueError, job_state
from pipeline.orchestration.spec import Workflow, WorkflowError

LOCK_FILE = "lock.json"


def describe(holder: dict[str, Any] | None) -> str:
    if holder and holder.get("job_id"):
        return f"SLURM controller job {holder['job_id']} (submitted {holder.get('submitted')}, log {holder.get('log')})"
    if holder:
        return f"a local run, pid {holder.get('pid')} on {holder.get('host')} since {holder.get('started')}"
    return "a launch whose lock names no holder"


class LaunchLock:
    def __init__(self, workflow: Workflow):
        self.workflow, self.path, self.took_over = workflow, workflow.state_dir / LOCK_FILE, False

    def holder(self) -> dict[str, Any] | None:
        return runs.read_json(self.path)

    def acquire(self, **holder: Any) -> None:
        """Takes the lock for `holder` (default: this process); raises WorkflowError while another holds it."""
        holder = holder or {"host": socket.gethostname(), "pid": os.getpid(), "started": runs.now()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder_now = self.holder()
                refuse_if_alive(self.workflow, holder_now)
                self._take_over(holder_now)
                continue
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(json.dumps({"workflow": self.workflow.name, **holder}, indent=2) + "\n")
            return
        raise WorkflowError(f"could not take {self.path}: other launches keep taking it")

    def _take_over(self, holder: dict[str, Any] | None) -> None:
        print(f"taking over the lock of {describe(holder)}: it is gone", flush=True)
        stale = self.path.with_name(f".{LOCK_FILE}.stale.{os.getpid()}")
        try:
            os.rename(self.path, stale)      # atomic: of two launches taking it over, one renames it
        except FileNotFoundError:
            return
        if runs.read_json(stale) != holder:  # another launch took it over just now: its lock goes back
            try:
                os.link(stale, self.path)
            except FileExistsError:
                pass
        else:
            self.took_over = True            # the caller releases the dead holder's Snakemake lock (--unlock)
        stale.unlink()

    def update(self, **fields: Any) -> None:
        runs.write_json(self.path, {**(self.holder() or {}), **fields})

    def release(self) -> None:
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> "LaunchLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, TypeError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def refuse_if_alive(workflow: Workflow, holder: dict[str, Any] | None) -> None:
    """Raises WorkflowError, naming the holder of the root's lock, unless it is gone (or there is none)."""
    lock_file = workflow.state_dir / LOCK_FILE
    running = f"workflow {workflow.name} in {workflow.root} is already running: {describe(holder)}"
    remove = f"if it is gone, remove {lock_file} and launch again"
    if holder and holder.get("job_id"):
        try:
            state = job_state(str(holder["job_id"]))
        except QueueError as error:
            raise WorkflowError(f"{running}? SLURM cannot tell ({error}); {remove}") from None
        if state in ACTIVE_STATES:
            raise WorkflowError(f"{running} (job {holder['job_id']} is {state}). Wait for it, or stop it "
                                f"(scancel {holder['job_id']}) and launch again.")
    elif holder and holder.get("host") != socket.gethostname():
        raise WorkflowError(f"{running}, whose process cannot be seen from this host; {remove}")
    elif holder and alive(holder.get("pid")):
        raise WorkflowError(f"{running} (its process is alive). Wait for it, or stop it (Ctrl-C) and launch again.")
