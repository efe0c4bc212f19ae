"""A lock that needs no flock (Lustre mounted noflock raises on it; NFS nolock and localflock lock one node only): a
file that names its holder, a SLURM job (`job_id`) or a process (`host`, `pid`), created whole and exclusively (a
hard link to a file already written: atomic on local disks, NFS, Lustre and GPFS alike, and no reader sees it half
written). Whoever finds it held asks whether the holder is gone: a job SLURM no longer runs, or a process that has
ended on this host (pids are reused: a live process under its pid that started at another time than the holder's
recorded `process_start` is not it). Then the lock is taken over (of two taking it over at once, one wins). A process
on another host cannot be checked from here: the caller refuses, naming the file to remove. A directory this process
may not write (its permissions, a read-only filesystem) raises LockNotWritable, naming the directory, not the
temporary file that could not be written there.

Used for the workflow's launch lock (pipeline/orchestration/lock.py) and a training's run directory
(pipeline/core/cluster/run_dir_lock.py)."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from data_prep.process_start import process_alive
from pipeline.core.cluster.slurm_jobs import ACTIVE_STATES, QueueError, job_state

Holder = dict[str, Any]


class LockContended(RuntimeError):
    """Others kept taking the lock while this process tried to."""


class LockNotWritable(OSError):
    """The lock's directory may not be written by this process."""

    def __init__(self, directory: Path, error: OSError):
        what = "is not writable" if directory.is_dir() else "cannot be created"
        super().__init__(error.errno, f"{directory} {what} ({error.strerror})", str(directory))
        self.directory = directory

    def __str__(self) -> str:
        return self.strerror


_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def alive(pid: Any, recorded_start: str | None = None) -> bool:
    """Whether the process `pid` on this host runs and, where its start was recorded, is still the one that recorded
    it (not another that got its pid since)."""
    try:
        return process_alive(int(pid), recorded_start)
    except (TypeError, ValueError):
        return False


def holder_state(holder: Holder) -> tuple[bool | None, str]:
    """(whether the holder is alive: None when that cannot be told from here, what was seen)."""
    if not holder:
        return None, "its lock file names no holder that can be read"
    if holder.get("job_id"):
        try:
            state = job_state(str(holder["job_id"]))
        except QueueError as error:
            return None, f"SLURM cannot tell ({error})"
        return state in ACTIVE_STATES, f"job {holder['job_id']} is {state}"
    if holder.get("host") != socket.gethostname():
        return None, f"its process (on {holder.get('host')}) cannot be seen from this host"
    if alive(holder.get("pid"), holder.get("process_start")):
        return True, "its process is alive"
    if alive(holder.get("pid")):
        return False, f"its process has ended (pid {holder.get('pid')} is now another process)"
    return False, "its process has ended"


class HolderLock:
    def __init__(self, path: Path):
        self.path = Path(path)

    def holder(self) -> Holder | None:
        """The holder; None when the lock is free, {} when its file names none that can be read."""
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (ValueError, OSError):
            return {}
        return holder if isinstance(holder, dict) else {}

    def acquire(self, holder: Holder, refuse: Callable[[Holder], None]) -> Holder | None:
        """Takes the lock for `holder`. Where another holds it, `refuse(that holder)` raises if that one keeps it;
        else it is taken over. Returns the holder taken over from (None: the lock was free)."""
        taken_from = None
        with self._writable():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            with self._writable():
                created = self._create(holder)
            if created:
                return taken_from
            current = self.holder()
            if current is None:              # released meanwhile
                continue
            refuse(current)
            if self._take_over(current):
                taken_from = current
        raise LockContended(f"could not take {self.path}: other processes keep taking it")

    @contextlib.contextmanager
    def _writable(self):
        try:
            yield
        except OSError as error:
            if error.errno not in _NOT_WRITABLE:
                raise
            raise LockNotWritable(self.path.parent, error) from None

    def _private(self, what: str) -> Path:
        return self.path.with_name(f".{self.path.name}.{what}.{socket.gethostname()}.{os.getpid()}")

    def _create(self, holder: Holder) -> bool:
        written = self._private("new")
        written.write_text(json.dumps(holder, indent=2) + "\n", encoding="utf-8")
        try:
            os.link(written, self.path)
        except FileExistsError:
            return False
        finally:
            written.unlink()
        return True

    def _take_over(self, holder: Holder) -> bool:
        stale = self._private("stale")
        try:
            os.rename(self.path, stale)      # atomic: of two taking it over, one renames it
        except FileNotFoundError:
            return False
        try:
            if HolderLock(stale).holder() != holder:     # another took it over just now: its lock goes back
                try:
                    os.link(stale, self.path)
                except FileExistsError:
                    pass
                return False
            return True
        finally:
            stale.unlink()

    def update(self, **fields: Any) -> None:
        """More about the holder (readers see the old file or the new one, never half of one)."""
        written = self._private("update")
        written.write_text(json.dumps({**(self.holder() or {}), **fields}, indent=2) + "\n", encoding="utf-8")
        os.replace(written, self.path)

    def release(self) -> None:
        self.path.unlink(missing_ok=True)
