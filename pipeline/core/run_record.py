"""A run's record of its config, <output_dir>/run_config.json: written when its training first starts, read at every
resume, so that a resume continues the run it names or refuses, saying what changed.

A resume (ckpt_path=<checkpoint> or last, or auto finding a checkpoint: infra/slurm/train.sbatch passes auto at every
start, with the config of the live checkout) compares what shapes the run with the config in effect: everything but
the operational keys (pipeline/core/shaping.py), with the shard set by its content, not its path. A change stops the
run before anything trains, naming each changed key, old -> new. A change that is meant is named at the resume:

    python pipeline/train.py ... ckpt_path=auto trainer.max_steps=2000000 resume.accept_changes=[trainer.max_steps]

(a key accepts itself and every key below it: resume.accept_changes=[optimizer]; a key that did not change is no
error, so a job script may keep the setting for its requeues). The run then goes on from the checkpoint's step
with the new values, and the log says so in a warning naming them: the learning-rate schedule and the optimizer's
rates are the new config's from that step on (a checkpoint holds the schedule's position only: pipeline/core/optim.py).

The record keeps the config of the first start, the config in effect, and each accepted change with the checkpoint,
step and time it took effect from. A run begun before records were kept resumes with a warning that nothing could be
compared, and its record starts there. Rank 0 writes the record (atomically) once training starts; every rank makes
the same check against the same file before any collective, so a refusal stops every rank and none waits on another.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.core.atomic_files import write_atomically
from pipeline.core.devices import is_first_process
from pipeline.core.shaping import FIRST_START_ONLY, OPERATIONAL, leaves, names, without_keys, without_later_defaults

RECORD_NAME = "run_config.json"
ACCEPT_KEY = "resume.accept_changes"
ABSENT = "(absent)"
log = logging.getLogger(__name__)


class ResumeRefused(ValueError):
    """A resume whose config changed what shapes the run, without the change accepted."""


@dataclasses.dataclass(frozen=True)
class StartCheck:
    """What a start found against its run's record: the changes accepted (key -> (old, new), as shown), and the
    record to write once training starts (None: it stays as it is)."""
    path: Path
    accepted: dict[str, tuple[str, str]]
    document: dict[str, Any] | None

    def write(self, step: int) -> None:
        """Rank 0, when training starts at `step` (the checkpoint's step on a resume)."""
        if self.document is None:
            return
        document = json.loads(json.dumps(self.document))
        time = datetime.datetime.now(datetime.UTC).astimezone().isoformat(timespec="seconds")
        entry = document["accepted_changes"][-1] if self.accepted else document["first_start"]
        entry.update(time=time, step=step)
        write_atomically(self.path, json.dumps(document, indent=1) + "\n")


def check_start(output_dir: Path, entry: str, config: Mapping[str, Any], resuming_from: str | None,
                inputs: Mapping[str, str]) -> StartCheck:
    """config: the run's resolved config; resuming_from: the checkpoint it resumes from (None: a first start);
    inputs: {key: digest of the content at that path} for the paths that count by content (data.path). Raises
    ResumeRefused on a resume that changes what shapes the run without accepting it."""
    path = Path(output_dir) / RECORD_NAME
    in_effect = json.loads(json.dumps({"config": config, "inputs": dict(inputs)}))
    if resuming_from is None:
        return StartCheck(path, {}, {"entry": entry, "first_start": {**in_effect}, "in_effect": in_effect,
                                     "accepted_changes": []})
    record = _read(path)
    if record is None:
        if is_first_process():
            log.warning("resuming %s without a record of the run's config (no %s: a run begun before records were "
                        "kept, or a checkpoint of another run directory): nothing can be compared, so the run goes on "
                        "with this config, its schedule included", resuming_from, path)
        first = {**in_effect, "note": f"recorded at a resume from {resuming_from}: the run began before its config "
                                      "was recorded here"}
        return StartCheck(path, {}, {"entry": entry, "first_start": first, "in_effect": in_effect,
                                     "accepted_changes": []})
    changes = differences(entry, record["in_effect"], in_effect)
    accept = accepted_keys(config)
    refused = [key for key in changes if not names(key, accept)]
    if refused:
        listed = "; ".join(f"{key}: {old} -> {new}" for key, (old, new) in changes.items())
        raise ResumeRefused(
            f"resuming {resuming_from}: this config changes what shapes the run since {path} recorded it: {listed}. "
            f"Resume with the recorded values; or, if the change is meant, add "
            f"{ACCEPT_KEY}=[{','.join(refused)}] (the run goes on from the checkpoint's step with the new values, "
            "its learning-rate schedule rebuilt from them); or start a new run in another output_dir")
    if not changes:
        return StartCheck(path, {}, None)
    if is_first_process():
        log.warning("resuming %s with changes accepted by %s: %s. The run goes on from the checkpoint's step with "
                    "them: the learning-rate schedule and the optimizer's rates are rebuilt from this config",
                    resuming_from, ACCEPT_KEY, "; ".join(f"{k}: {a} -> {b}" for k, (a, b) in changes.items()))
    accepted = {"checkpoint": str(resuming_from), "changes": {key: list(values) for key, values in changes.items()}}
    document = {**record, "in_effect": in_effect,
                "accepted_changes": [*record.get("accepted_changes", []), accepted]}
    return StartCheck(path, changes, document)


def differences(entry: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """{key: (old, new) as shown} of what shapes a resumed run, between two {config, inputs} states."""
    a, b = _compared(entry, old), _compared(entry, new)
    return {key: (_shown(key, old, a), _shown(key, new, b)) for key in sorted(set(a) | set(b))
            if a.get(key, ABSENT) != b.get(key, ABSENT)}


def accepted_keys(config: Mapping[str, Any]) -> list[str]:
    value = (config.get("resume") or {}).get("accept_changes") or []
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, (list, tuple)) or not all(isinstance(key, str) and key for key in value):
        raise ValueError(f"{ACCEPT_KEY}={value!r}: give a list of config keys, e.g. "
                         f"{ACCEPT_KEY}=[trainer.max_steps,optimizer.lr]")
    return list(value)


def _compared(entry: str, state: Mapping[str, Any]) -> dict[str, Any]:
    """Leaf -> value of what shapes a resumed run; a path that counts by content as its content."""
    config = without_later_defaults(entry, state["config"])   # a setting added later, at its default: as before
    kept = without_keys(config, (*OPERATIONAL.get(entry, ()), *FIRST_START_ONLY.get(entry, ())))
    flat = dict(leaves(kept))
    flat.update({key: {"content": digest} for key, digest in (state.get("inputs") or {}).items()})
    return flat


def _shown(key: str, state: Mapping[str, Any], flat: Mapping[str, Any]) -> str:
    if key not in flat:
        return ABSENT
    digest = (state.get("inputs") or {}).get(key)
    if digest is not None:
        path = dict(leaves(state["config"])).get(key)
        return f"{path} (content {digest[:12]})"
    return json.dumps(flat[key])


def _read(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
        record["in_effect"]["config"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{path} is not a run record this version can read; a resume compares its config with "
                         "it. Move it aside to resume without a comparison") from None
    return record
