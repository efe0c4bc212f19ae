"""One launch at a time on a workflow root: <root>/_workflow/lock.json (pipeline/core/cluster/holder_lock.py) names a
local run or the controller job; a second launch is refused, naming it, or takes over from a holder that is gone."""
from __future__ import annotations

import os
import socket
from typing import Any

from pipeline.core.cluster.holder_lock import HolderLock, LockContended, holder_state
from pipeline.orchestration import runs
from pipeline.orchestration.workflow_config import Workflow, WorkflowError

LOCK_FILE = "lock.json"


def describe(holder: dict[str, Any] | None) -> str:
    if holder and holder.get("job_id"):
        return f"SLURM controller job {holder['job_id']} (submitted {holder.get('submitted')}, log {holder.get('log')})"
    if holder:
        return f"a local run, pid {holder.get('pid')} on {holder.get('host')} since {holder.get('started')}"
    return "a launch whose lock names no holder"


class LaunchLock(HolderLock):
    def __init__(self, workflow: Workflow):
        super().__init__(workflow.state_dir / LOCK_FILE)
        self.workflow, self.took_over = workflow, False

    def acquire(self, **holder: Any) -> None:
        """Takes the lock for `holder` (default: this process); raises WorkflowError while another holds it."""
        holder = holder or {"host": socket.gethostname(), "pid": os.getpid(), "started": runs.now()}
        try:
            taken_from = super().acquire({"workflow": self.workflow.name, **holder},
                                         lambda current: refuse_if_alive(self.workflow, current))
        except LockContended as error:
            raise WorkflowError(str(error)) from None
        if taken_from is not None:
            print(f"taking over the lock of {describe(taken_from)}: it is gone", flush=True)
            self.took_over = True            # the caller releases the dead holder's Snakemake lock (--unlock)

    def __enter__(self) -> LaunchLock:
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
    if is_alive:
        stop = f"scancel {holder['job_id']}" if holder.get("job_id") else "Ctrl-C"
        raise WorkflowError(f"{running} ({seen}). Wait for it, or stop it ({stop}) and launch again.")
