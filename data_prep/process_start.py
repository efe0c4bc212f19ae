"""Whether a process recorded by its pid still runs: a pid is reused once its process ends (a container restarted
gets pid 1 again; a busy node cycles through pid_max), so a pid that is alive may be another process. A record that
also keeps the process's start time (Linux /proc: clock ticks since boot) tells the two apart.

Torch- and Beam-free: data_prep (the spill's owner, data_prep/spill_owner.py) and the trainer's lock
(pipeline/core/cluster/holder_lock.py) both use it. It lives in data_prep because data_prep cannot import the pipeline
package: `python data_prep/run.py` puts data_prep/ first on sys.path, where data_prep/pipeline.py shadows it.
"""
from __future__ import annotations

import os


def _proc_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (the state) on; field 22, the start in clock ticks since boot, is [19]. None: no
    such process, or no /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_start(pid: int) -> str | None:
    """The start of process `pid`, to record beside its pid; None where /proc cannot say."""
    fields = _proc_fields(pid)
    return fields[19] if fields else None


def process_alive(pid: int, recorded_start: str | None) -> bool:
    """Whether the process that recorded itself still runs (a reused pid does not count, where /proc says so; a record
    without a start counts any live process of that pid, as before starts were recorded)."""
    fields = _proc_fields(pid)
    if fields is not None:
        return fields[0] not in ("Z", "X") and (recorded_start is None or fields[19] == recorded_start)
    if os.path.isdir("/proc/self"):
        return False          # Linux, and no such process
    try:                      # elsewhere: whether the pid exists at all
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's process
        return True
    return True
