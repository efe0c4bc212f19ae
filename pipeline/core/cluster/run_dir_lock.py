"""One trainer per run directory: <output_dir>/.trainer_lock.json names the trainer that writes there, and a second
one is refused, naming it, before it reads or removes anything (a resume's start-up removes the partial checkpoint
files it finds, which a live trainer may be writing). Pre-training and fine-tuning take it at their start, whether
run by the workflow, by train.sbatch or by hand.

The holder is a SLURM job (its id: every rank and task of the job shares it, and a requeued job keeps it) or, outside
SLURM, the launching process (host and pid). Only a trainer's first process (global rank 0, as the launchers say it
before the Trainer exists) takes the lock; the others, which Lightning's launcher, srun or torchrun start beside it,
go on (a refused first process ends them: srun --kill-on-bad-exit and torchrun stop the rest, Lightning's launcher
never starts them). The lock is released when the run ends, also when it fails; a run that stopped to be requeued
keeps it for its job's next start.

A holder is gone when SLURM no longer runs its job, or its process has ended on this host: its lock is then taken
over, and the log says so. A live process under the holder's pid that started at another time than the holder
recorded is not the holder (pids are reused: a restarted container's trainer is pid 1 again). A start of the same
job is the same trainer (a requeue, or a restart inside the job), unless the holder is another live process of that
job on this host. A process on another host without a job id cannot be checked from here: the refusal names the lock
file to remove once that trainer is known to be gone. A run directory this process may not write (another user's, a
read-only filesystem) is refused as such (RunDirNotWritable), before anything else is read or written there.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import logging
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from data_prep.process_start import process_start
from pipeline.core.cluster.holder_lock import Holder, HolderLock, LockContended, LockNotWritable, alive, holder_state
from pipeline.core.devices import is_first_process

LOCK_NAME = ".trainer_lock.json"
log = logging.getLogger(__name__)


class RunDirInUse(RuntimeError):
    """Another trainer, alive or not known to be gone, holds the run directory."""


class RunDirNotWritable(RuntimeError):
    """The run directory may not be written by this trainer."""


def this_trainer() -> Holder:
    holder: Holder = {"host": socket.gethostname(), "pid": os.getpid(), "process_start": process_start(os.getpid()),
                      "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds")}
    if os.environ.get("SLURM_JOB_ID"):
        holder.update(job_id=os.environ["SLURM_JOB_ID"], restart=int(os.environ.get("SLURM_RESTART_COUNT") or 0))
    return holder


def describe(holder: Holder) -> str:
    where = f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('started')}"
    if not holder:
        return "a trainer whose lock names no holder"
    if holder.get("job_id"):
        return f"SLURM job {holder['job_id']} (restart {holder.get('restart', 0)}; {where})"
    return f"a trainer outside SLURM ({where})"


def _same_job(holder: Holder, me: Holder) -> bool:
    """An earlier start of this job (requeued, restarted), or this start: not a second trainer."""
    if not me.get("job_id") or str(holder.get("job_id")) != str(me["job_id"]):
        return False
    other_process_here = (holder.get("restart") == me["restart"] and holder.get("host") == me["host"]
                          and holder.get("pid") != me["pid"] and alive(holder.get("pid"), holder.get("process_start")))
    return not other_process_here


class RunDirLock:
    def __init__(self, output_dir: Path):
        self.output_dir, self.file = Path(output_dir), HolderLock(Path(output_dir) / LOCK_NAME)
        self.holder: Holder | None = None
        self.keep = False                    # set when the run stopped to be requeued: its job's next start holds it

    def acquire(self) -> None:
        me = this_trainer()
        gone_because = ""                    # what holder_state saw of a holder taken over, for the log

        def refuse(current: Holder) -> None:
            nonlocal gone_because
            if _same_job(current, me):
                return
            is_alive, seen = holder_state(current)
            gone_because = seen
            held = f"run directory {self.output_dir} is in use by {describe(current)}"
            if is_alive:
                stop = f"scancel {current['job_id']}" if current.get("job_id") else f"kill {current.get('pid')}"
                raise RunDirInUse(f"{held}: {seen}. A second trainer there would overwrite its checkpoints; wait for "
                                  f"it, or stop it ({stop}), or give this run another output directory")
            if is_alive is None:
                raise RunDirInUse(f"{held}? {seen}. If that trainer is gone, remove {self.file.path} and start again")

        try:
            taken_from = self.file.acquire(me, refuse)
        except LockContended as error:
            raise RunDirInUse(str(error)) from None
        except LockNotWritable as error:
            raise RunDirNotWritable(
                f"run directory {error}: a trainer writes its lock ({LOCK_NAME}), checkpoints and logs there. Make it "
                "writable to this user, or give the run another output directory (hydra.run.dir=... on the command "
                "line, output_dir=... when calling train())") from None
        if taken_from is not None and not _same_job(taken_from, me):
            log.info("took over %s from %s: it is gone (%s)", self.file.path, describe(taken_from), gone_because)
        self.holder = me

    def release(self) -> None:
        """Removes the lock if it still names this trainer."""
        if self.holder is not None and not self.keep and self.file.holder() == self.holder:
            self.file.release()
        self.holder = None


@contextlib.contextmanager
def hold_run_dir(output_dir: Path) -> Iterator[RunDirLock]:
    """The run directory held by this trainer for the block (on its first process; the others hold nothing)."""
    lock = RunDirLock(output_dir)
    if is_first_process():
        lock.acquire()
    try:
        yield lock
    finally:
        lock.release()


def holds_run_dir(program: str) -> Callable:
    """A run function `f(cfg, ...)` that holds its output directory while it runs (program: app.output_dir's)."""
    def decorate(function: Callable) -> Callable:
        @functools.wraps(function)
        def run(cfg: Any, *args: Any, **kwargs: Any) -> Any:
            from pipeline.core.run.output_dir import output_dir

            with hold_run_dir(output_dir(cfg, program)):
                return function(cfg, *args, **kwargs)
        return run
    return decorate
