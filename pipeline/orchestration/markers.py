"""A marker per stage (<root>/_workflow/markers/<stage>.json) saying where the stage is, and the hash that decides
whether a finished stage can be skipped.

States: submitted (a SLURM job waits for it), running, done, failed, cancelled (an earlier stage it needs failed),
interrupted (its process was stopped: SLURM requeue, time limit, Ctrl-C). A stage's hash covers its command (the
entry point and every override, paths of its inputs and outputs included) and the hashes of the stages it reads, so
a change anywhere upstream reaches it. A done marker also records which run of each input it consumed (their
run_id): an input produced again, even with the same config, makes the stage stale.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any, Mapping

MARKER_DIR = "markers"
DONE, FAILED, RUNNING, SUBMITTED, CANCELLED, INTERRUPTED = (
    "done", "failed", "running", "submitted", "cancelled", "interrupted")
# The record a train stage leaves in its run directory: which config and inputs its checkpoints belong to.
ATTEMPT_FILE = "workflow_attempt.json"


def stage_hash(command_argv: tuple[str, ...] | list[str], env: Mapping[str, str],
               upstream_hashes: Mapping[str, str]) -> str:
    # argv[0] (the interpreter's path) is left out: the same stage run by another Python is the same stage.
    record = {"argv": list(command_argv[1:]), "env": dict(sorted(env.items())),
              "inputs": dict(sorted(upstream_hashes.items()))}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def marker_path(state_dir: Path, stage: str) -> Path:
    return Path(state_dir) / MARKER_DIR / f"{stage}.json"


def read_marker(state_dir: Path, stage: str) -> dict[str, Any] | None:
    path = marker_path(state_dir, stage)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        return None   # half-written by a killed process (writes are atomic, but be safe): as if absent


def write_marker(state_dir: Path, stage: str, state: str, **fields: Any) -> dict[str, Any]:
    record = {"stage": stage, "state": state, "updated_at": now(), **fields}
    write_json_atomically(marker_path(state_dir, stage), record)
    return record


def write_json_atomically(path: Path, record: Mapping[str, Any]) -> None:
    """Readers (status, other jobs) see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def outputs_complete(output_dir: Path, complete_when: tuple[str, ...] | list[str]) -> bool:
    return all((Path(output_dir) / name).exists() for name in complete_when)


def is_up_to_date(marker: Mapping[str, Any] | None, current_hash: str, output_dir: Path,
                  complete_when: tuple[str, ...] | list[str], inputs_now: Mapping[str, str | None]) -> bool:
    """Done with the same hash, its outputs still there, and made from the runs of its inputs that exist now."""
    return bool(marker and marker.get("state") == DONE and marker.get("config_hash") == current_hash
                and outputs_complete(output_dir, complete_when)
                and dict(marker.get("inputs_consumed") or {}) == dict(inputs_now))
