"""resume.accept_changes: which of a resume's changes the user accepted, each at its value.

An entry is a key, or a key and the value it is accepted at:

    resume.accept_changes=[trainer.max_steps]          # this resume's change of trainer.max_steps (or below it)
    resume.accept_changes=[trainer.max_steps:3000000]  # a change of trainer.max_steps to 3000000, and no other value

A key without a value accepts one change: the run's record notes the entries that accepted each change, and an entry
that accepted one accepts no later change of its keys. A job script keeps its list for the requeues
(infra/slurm/train.sbatch re-reads the live checkout at each): without this, `[optimizer]` accepted once would let a
later edit of the config's rate, weight decay or betas through at any value, with a warning in a log nobody reads. A
key with its value accepts that value at any resume, and nothing else.

`code` accepts a change of the training code (pipeline/core/run/run_versions.py), and with it the config keys that the
new code added or removed (a key absent from the record, or from the config): they come with the code.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from pipeline.core.run.shaping import names

ACCEPT_KEY = "resume.accept_changes"
CODE_KEY = "code"
ABSENT = "(absent)"
_ANY_VALUE = object()


@dataclasses.dataclass(frozen=True)
class AcceptEntry:
    text: str                   # as the config gives it
    key: str
    value: Any = _ANY_VALUE     # key:value: the one value accepted

    @property
    def has_value(self) -> bool:
        return self.value is not _ANY_VALUE

    def covers(self, key: str, new: Any) -> bool:
        if not self.has_value:
            return names(key, [self.key])
        return key == self.key and _same(self.value, new)


@dataclasses.dataclass(frozen=True)
class Decision:
    accepted_by: dict[str, str]          # changed key -> the entry that accepted it
    refused: list[str]                   # changed keys no entry accepts
    spent: dict[str, str]                # of those refused: key -> the bare entry that accepted an earlier change


def entries_of(config: Mapping[str, Any]) -> list[AcceptEntry]:
    value = (config.get("resume") or {}).get("accept_changes") or []
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) and item for item in value):
        raise ValueError(f"{ACCEPT_KEY}={value!r}: give a list of config keys, each alone or with the value it is "
                         f"accepted at, e.g. {ACCEPT_KEY}=[trainer.max_steps:2000000,optimizer.lr]")
    entries = []
    for text in value:
        key, colon, shown = text.partition(":")
        if not key.strip() or (colon and not shown.strip()):
            raise ValueError(f"{ACCEPT_KEY}: {text!r} is not a key or key:value")
        entries.append(AcceptEntry(text, key.strip(), _parsed(shown.strip())) if colon
                       else AcceptEntry(text, key.strip()))
    return entries


def decide(changes: Mapping[str, tuple[Any, Any]], entries: Iterable[AcceptEntry], spent: Iterable[str]) -> Decision:
    """changes: key -> (old, new) values (ABSENT where a side has none); spent: the texts of the bare entries that
    accepted an earlier change of this run."""
    entries, spent = list(entries), set(spent)
    accepted_by: dict[str, str] = {}
    refused: list[str] = []
    spent_by: dict[str, str] = {}
    for key, (_, new) in sorted(changes.items()):
        covering = [entry for entry in entries if entry.covers(key, new)]
        usable = [entry for entry in covering if entry.has_value or entry.text not in spent]
        if usable:
            accepted_by[key] = usable[0].text
        else:
            refused.append(key)
            if covering:
                spent_by[key] = covering[0].text
    code_entry = accepted_by.get(CODE_KEY)
    if code_entry is not None:       # the keys the new code added or removed come with it
        for key in [key for key in refused if ABSENT in changes[key]]:
            refused.remove(key)
            spent_by.pop(key, None)
            accepted_by[key] = code_entry
    return Decision(accepted_by, refused, spent_by)


def suggestion(keys: Iterable[str], changes: Mapping[str, tuple[Any, Any]]) -> str:
    """The accept_changes list that accepts `keys` at this resume's values (a value only for a plain scalar)."""
    shown = []
    for key in keys:
        new = changes[key][1]
        plain = isinstance(new, (int, float, str)) and not isinstance(new, bool) and new != ABSENT \
            and "," not in str(new) and "]" not in str(new)
        shown.append(f"{key}:{new}" if plain else key)
    return f"{ACCEPT_KEY}=[{','.join(shown)}]"


def _parsed(text: str) -> Any:
    value = yaml.safe_load(text)
    if isinstance(value, str):          # YAML 1.1 reads 1e-3 as a string
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _same(a: Any, b: Any) -> bool:
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) == float(b)
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
