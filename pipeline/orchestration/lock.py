"""One launch at a time on a workflow root: <root>/_workflow/lock.json (pipeline/core/holder_lock.py: created whole
and exclusively, no flock needed) names its holder: a local run (host, pid) for its whole length; for SLURM the
controller job (its id) while it waits in the queue, runs and is requeued. The launching process holds it only until
it has submitted the controller, and submits it held (sbatch --hold): the job id is in the lock before the controller
can start, so it never finds the launching process there and refuses its own launch. A second launch is refused,
naming the holder, unless the holder is gone (a dead process on this host, a job SLURM no longer runs): then it is
taken over, and the caller releases Snakemake's own lock, which the dead holder left. When that cannot be told, the
refusal says which file to remove."""
from __future__ import annotations

import os
import socket
from typing import Any

from pipeline.core.holder_lock import HolderLock, LockContended, alive, holder_state  # noqa: F401  (alive: views)
from pipeline.orchestration import runs
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
        self.workflow, self.file, self.took_over = workflow, HolderLock(workflow.state_dir / LOCK_FILE), False
        self.path = self.file.path

    def holder(self) -> dict[str, Any] | None:
        return self.file.holder()

    def acquire(self, **holder: Any) -> None:
        """Takes the lock for `holder` (default: this process); raises WorkflowError while another holds it."""
        holder = holder or {"host": socket.gethostname(), "pid": os.getpid(), "started": runs.now()}
        try:
            taken_from = self.file.acquire({"workflow": self.workflow.name, **holder},
                                           lambda current: refuse_if_alive(self.workflow, current))
        except LockContended as error:
            raise WorkflowError(str(error)) from None
        if taken_from is not None:
            print(f"taking over the lock of {describe(taken_from)}: it is gone", flush=True)
            self.took_over = True            # the caller releases the dead holder's Snakemake lock (--unlock)

    def update(self, **fields: Any) -> None:
        self.file.update(**fields)

    def release(self) -> None:
        self.file.release()

    def __enter__(self) -> "LaunchLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def refuse_if_alive(workflow: Workflow, holder: dict[str, Any] | None) -> None:
    """Raises WorkflowError, naming the holder of the root's lock, unless it is gone (or there is none)."""
    if not holder:
        return
    is_alive, seen = holder_state(holder)
    running = f"workflow {workflow.name} in {workflow.root} is already running: {describe(holder)}"
    if is_alive is None:
        raise WorkflowError(f"{running}? {seen}; if it is gone, remove {workflow.state_dir / LOCK_FILE} and launch "
                            "again")
    if is_alive and holder.get("job_id"):
        raise WorkflowError(f"{running} ({seen}). Wait for it, or stop it (scancel {holder['job_id']}) and launch "
                            "again.")
    if is_alive:
        raise WorkflowError(f"{running} ({seen}). Wait for it, or stop it (Ctrl-C) and launch again.")
