"""A run's record of its config, <output_dir>/run_config.json: written when its training first starts, read at every
resume, so that a resume continues the run it names or refuses, saying what changed.

A resume (ckpt_path=<checkpoint> or last, or auto finding a checkpoint: infra/slurm/train.sbatch passes auto at every
start, with the config of the live checkout) compares what shapes the run with what is in effect now (auto finding
none starts from step 0 with a new record only where the run has no checkpoint and its record shows no resume:
fresh_start.py; a resume from an earlier step than the run's later checkpoints is a rollback: rollback.py):
- the config: everything but the operational keys (pipeline/core/run/shaping.py), with the shard set by its content (its
  shards, tokenizer, objective and masking: data_prep/content_identity.py), not its path;
- what the config leaves to the machine: the number of processes it resolved to (`trainer.devices=auto` on another
  node count is another data stream), the training code and the packages (pipeline/core/run/run_versions.py);
- the checkpoint's own hyper-parameters (model, optimizer, schedule, seed, max_steps), which it carries whatever
  directory it sits in: a run whose record is missing, or a checkpoint of another run, is compared too.
A change stops the run before anything trains, naming each changed key, old -> new. A change that is meant is named
at the resume, each key once or at its value (pipeline/core/run/accepted_changes.py):

    python pipeline/train.py ... ckpt_path=auto trainer.max_steps=2000000 resume.accept_changes=[trainer.max_steps]

(a key accepts itself and every key below it: resume.accept_changes=[optimizer]; a key that did not change is no
error, so a job script may keep the setting for its requeues, where it accepts nothing new). The run then goes on from
the checkpoint's step with the new values, and the log says so in a warning naming them: the learning-rate schedule and
the optimizer's rates are the new config's from that step on (a checkpoint holds the schedule's position only:
pipeline/core/optim/optimizers.py).

The record keeps the config of the first start, the config in effect, and each accepted change with the checkpoint,
step, time and entries that accepted it. A run begun before records were kept resumes against its checkpoint's
hyper-parameters, with a warning that nothing else could be compared, and its record starts there; a record written
before the versions were kept compares them from its next start on. Rank 0 writes the record (atomically) once
training starts; every rank makes the same check against the same files before any collective, so a refusal stops
every rank and none waits on another.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.core.checkpoints.atomic_files import write_atomically
from pipeline.core.devices import is_first_process
from pipeline.core.run import accepted_changes
from pipeline.core.run.accepted_changes import ABSENT, ACCEPT_KEY, entries_of
from pipeline.core.run.run_versions import describe_code
from pipeline.core.run.shaping import FIRST_START_ONLY, OPERATIONAL, leaves, without_keys, without_later_defaults

RECORD_NAME = "run_config.json"
INPUTS_IDENTITY = 2     # the shard set's content with its objective and masking (1: without)
log = logging.getLogger(__name__)


class ResumeRefused(ValueError):
    """A resume whose config changed what shapes the run, without the change accepted."""


@dataclasses.dataclass(frozen=True)
class StartCheck:
    """What a start found against its run's record: the changes accepted (key -> (old, new), as shown), and the
    record to write once training starts (None: it stays as it is), with the time and step in the entry it begins
    (the first start's, the accepted change's; None: only the state in effect is brought up to date)."""
    path: Path
    accepted: dict[str, tuple[str, str]]
    document: dict[str, Any] | None
    begins: str | None = "first_start"

    def write(self, step: int) -> None:
        """Rank 0, when training starts at `step` (the checkpoint's step on a resume)."""
        if self.document is None:
            return
        document = json.loads(json.dumps(self.document))
        time = datetime.datetime.now(datetime.UTC).astimezone().isoformat(timespec="seconds")
        if self.begins == "accepted":
            document["accepted_changes"][-1].update(time=time, step=step)
        elif self.begins == "first_start":
            document["first_start"].update(time=time, step=step)
        write_atomically(self.path, json.dumps(document, indent=1) + "\n")


@dataclasses.dataclass(frozen=True)
class InEffect:
    """What a start runs with. inputs: {key: digest of the content at that path} for the paths that count by content
    (data.path), and legacy_inputs the same digests as records of INPUTS_IDENTITY 1 took them; resolved: what the config
    leaves to the machine ({"world_size", "code", "packages"}); checkpoint_changes: key -> (as the checkpoint was
    trained, now) where the resumed checkpoint's own hyper-parameters differ from this config."""
    config: Mapping[str, Any]
    inputs: Mapping[str, str]
    resolved: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    legacy_inputs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    checkpoint_changes: Mapping[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)

    def state(self) -> dict[str, Any]:
        return json.loads(json.dumps({"config": self.config, "inputs": dict(self.inputs),
                                      "inputs_identity": INPUTS_IDENTITY, "resolved": dict(self.resolved)}))


def check_start(output_dir: Path, entry: str, now: InEffect, resuming_from: str | None) -> StartCheck:
    """resuming_from: the checkpoint the start resumes from (None: a first start). Raises ResumeRefused on a resume
    that changes what shapes the run without accepting it."""
    path = Path(output_dir) / RECORD_NAME
    in_effect = now.state()
    entries = entries_of(now.config)
    if resuming_from is None:
        return StartCheck(path, {}, {"entry": entry, "first_start": {**in_effect}, "in_effect": in_effect,
                                     "accepted_changes": []})
    record = _read(path)
    if record is None:
        # A checkpoint of another run directory (resume.continue_from: a decay phase from its stable run), or a run
        # begun before records were kept: what the checkpoint was trained with is all there is to compare
        another_run = Path(resuming_from).resolve().parent.parent != Path(output_dir).resolve()
        if is_first_process():
            log.warning("resuming %s without a record of the run's config here (no %s: %s): only the checkpoint's "
                        "own hyper-parameters can be compared", resuming_from, path,
                        "it is a checkpoint of another run directory" if another_run else
                        "a run begun before records were kept")
        first = {**in_effect, "note": f"recorded at a resume from {resuming_from}: " + (
            "a checkpoint of another run directory, continued here" if another_run else
            "the run began before its config was recorded here")}
        document = {"entry": entry, "first_start": first, "in_effect": in_effect, "accepted_changes": []}
        old = None
    else:
        document, old = record, _comparable(record["in_effect"], now)
    changes = _changes(entry, old, in_effect) if old is not None else {}
    from_checkpoint = {key: values for key, values in now.checkpoint_changes.items() if key not in changes}
    changes.update(from_checkpoint)       # the record's old value, where it has one: the same change, shown so
    decision = accepted_changes.decide(changes, entries, _spent(document))
    shown = {key: (_shown(key, old, values[0]), _shown(key, in_effect, values[1])) for key, values in changes.items()}
    if old is not None:       # where the record and the checkpoint disagree, say which is which
        shown.update({key: (f"{shown[key][0]} (as the checkpoint was trained)", shown[key][1])
                      for key in from_checkpoint})
    shown = dict(sorted(shown.items()))
    if decision.refused:
        raise ResumeRefused(_refusal(resuming_from, path if old is not None else None, shown, changes, decision))
    if not changes:
        if record is None:
            return StartCheck(path, {}, document)
        # A record of an earlier version: brought up to date, so that the next start compares all of it
        current = record["in_effect"].get("inputs_identity", 1) == INPUTS_IDENTITY and record["in_effect"].get(
            "resolved")
        return StartCheck(path, {}, None if current else {**record, "in_effect": in_effect}, begins=None)
    if is_first_process():
        log.warning("resuming %s with changes accepted by %s: %s. The run goes on from the checkpoint's step with "
                    "them: the learning-rate schedule and the optimizer's rates are rebuilt from this config",
                    resuming_from, ACCEPT_KEY, "; ".join(f"{k}: {a} -> {b}" for k, (a, b) in shown.items()))
    accepted = {"checkpoint": str(resuming_from), "changes": {key: list(values) for key, values in shown.items()},
                "accepted_by": sorted(set(decision.accepted_by.values()))}
    document = {**document, "in_effect": in_effect, "accepted_changes": [*document.get("accepted_changes", []),
                                                                           accepted]}
    return StartCheck(path, shown, document, begins="accepted")


def _changes(entry: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (old, new) values} of what shapes a resumed run; the machine's share only where both states have it."""
    both = bool(old.get("resolved")) and bool(new.get("resolved"))
    a, b = _compared(entry, old, both), _compared(entry, new, both)
    return {key: (a.get(key, ABSENT), b.get(key, ABSENT)) for key in sorted(set(a) | set(b))
            if a.get(key, ABSENT) != b.get(key, ABSENT)}


def _comparable(recorded: dict[str, Any], now: InEffect) -> dict[str, Any]:
    """The record's state as this version compares it: one recorded before the versions were kept, said once; a shard
    set's content taken the way the record took it."""
    if not recorded.get("resolved") and now.resolved and is_first_process():
        log.warning("the run's record predates the record of its device count, code and packages: they are recorded "
                    "from this start on, and compared from the next")
    if recorded.get("inputs_identity", 1) == INPUTS_IDENTITY:
        return recorded
    # The record hashed the shards and the tokenizer only: compare it with that, and record the new identity
    return {**recorded, "inputs": {key: now.legacy_inputs.get(key, digest)
                                   for key, digest in (recorded.get("inputs") or {}).items()}}


def _compared(entry: str, state: Mapping[str, Any], with_resolved: bool) -> dict[str, Any]:
    """Leaf -> value of what shapes a resumed run; a path that counts by content as its content."""
    config = without_later_defaults(entry, state["config"])   # a setting added later, at its default: as before
    kept = without_keys(config, (*OPERATIONAL.get(entry, ()), *FIRST_START_ONLY.get(entry, ())))
    flat = dict(leaves(kept))
    flat.update({key: {"content": digest} for key, digest in (state.get("inputs") or {}).items()})
    resolved = state.get("resolved") or {}
    if with_resolved:
        flat["world_size"] = resolved.get("world_size")
        flat["code"] = (resolved.get("code") or {}).get("sources_sha256")
        flat.update({f"packages.{name}": version for name, version in (resolved.get("packages") or {}).items()})
    return flat


def _shown(key: str, state: Mapping[str, Any] | None, value: Any) -> str:
    if value is ABSENT or value == ABSENT:
        return ABSENT
    state = state or {}
    if key == "world_size":
        return f"{value} processes (trainer.devices x trainer.num_nodes, as resolved)"
    if key == "code":
        return describe_code((state.get("resolved") or {}).get("code"))
    digest = (state.get("inputs") or {}).get(key)
    if digest is not None:
        path = dict(leaves(state["config"])).get(key)
        return f"{path} (content {digest[:12]})"
    return json.dumps(value)


def _spent(document: Mapping[str, Any]) -> set[str]:
    """The bare entries of accept_changes that accepted a change of this run already."""
    return {text for accepted in document.get("accepted_changes", []) for text in accepted.get("accepted_by", [])
            if ":" not in text}


def _refusal(resuming_from: str, record: Path | None, shown: dict[str, tuple[str, str]],
             changes: dict[str, tuple[Any, Any]], decision: accepted_changes.Decision) -> str:
    since = f"since {record} recorded it" if record is not None else "since its checkpoint was trained"
    listed = "; ".join(f"{key}: {old} -> {new}" for key, (old, new) in shown.items())
    message = f"resuming {resuming_from}: this config changes what shapes the run {since}: {listed}. "
    if decision.spent:
        spent = ", ".join(f"{key} (by {entry})" for key, entry in decision.spent.items())
        message += (f"{ACCEPT_KEY} names keys that accepted a change of this run before and accept no other: "
                    f"{spent}; name the value a change is accepted at. ")
    if "code" in decision.refused:
        message += ("The training code changed (a pull or an edit between two starts); the keys it added or removed "
                    "come with it when `code` is accepted. ")
    values = "the recorded values" if record is not None else "the values it was trained with"
    return (message + f"Resume with {values}; or, if the change is meant, add "
            f"{accepted_changes.suggestion(decision.refused, changes)} (the run goes on from the checkpoint's step "
            "with the new values, its learning-rate schedule rebuilt from them); or start a new run in another "
            "output_dir")


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
