"""A stage's identity, its rule's parameter: a hash of what shapes its result, its composed config minus what shapes
nothing (pipeline/core/run/shaping.py), files from outside the workflow by content. Not the code: its version is
recorded and shown, and re-runs a stage only when asked (workflow.rerun_code_changed)."""
from __future__ import annotations

import functools
import glob
import hashlib
import json
import modulefinder
import os
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.core.app import REPO_ROOT
from pipeline.core.file_stamp import file_stamp, files_sha256
from pipeline.core.run.shaping import OPERATIONAL, leaves, without_keys, without_later_defaults
from pipeline.orchestration import runs
from pipeline.orchestration.workflow_config import ENTRY_SCRIPTS

# What shapes no result: the operational keys (pipeline/core/run/shaping.py), and the paths wired from earlier stages,
# whose content counts through their sentinels (each key tested both ways in tests/orchestration/test_identity.py).
WIRED_INPUTS = {"train": ("data.path", "init_from_checkpoint", "resume.continue_from"), "finetune": ("init",)}
NOT_SHAPING = {entry: (*keys, *WIRED_INPUTS.get(entry, ())) for entry, keys in OPERATIONAL.items()}
# Paths to files from outside the workflow: they count by their content.
EXTERNAL_INPUTS = {"data_prep": ("inputs", "vocab.file", "tokenizer.file"),
                   "finetune": ("data.dir", "data.train", "data.dev", "data.test", "tokenizer")}
PACKAGES = ("torch", "pytorch-lightning", "deepspeed", "transformers", "tokenizers")


class Checksums:
    """sha256 of local files, cached (a 20 GB corpus is read once) until a file's stamp changes (file_stamp.py), or
    for none of them with `rehash` (workflow.rehash_inputs=true)."""

    def __init__(self, path: Path, rehash: bool = False):
        self.path, self.cache = path, {} if rehash else runs.read_json(path) or {}

    def content(self, value: Any) -> Any:
        """A path or glob, or a list of them (data prep's inputs, {path: ..., format: ...}), by content."""
        if isinstance(value, (list, Mapping)):
            return ([self.content(v) for v in value] if isinstance(value, list) else
                    {k: self.content(v) if k == "path" else v for k, v in value.items()})
        if not isinstance(value, str) or "://" in value:
            return value                              # a remote path (a hub name, gs://): as given
        found = sorted(glob.glob(value, recursive=True)) if glob.has_magic(value) else [value]
        files = [f for p in found for f in ([p] if os.path.isfile(p) else sorted(map(str, Path(p).rglob("*"))))
                 if os.path.isfile(f)]
        base = value if os.path.isdir(value) else None
        names = [f"{os.path.relpath(f, base or os.path.dirname(f))}\0{self._sha256(f)}\0" for f in files]
        return {"files": len(files), "sha256": hashlib.sha256("".join(names).encode()).hexdigest()}

    def _sha256(self, name: str) -> str:
        stamp, key = list(file_stamp(name).values()), os.path.realpath(name)   # the cache's lists: inode first
        if (self.cache.get(key) or {}).get("stamp") != stamp:
            with open(name, "rb") as handle:
                self.cache[key] = {"stamp": stamp, "sha256": hashlib.file_digest(handle, "sha256").hexdigest()}
        return self.cache[key]["sha256"]

    def save(self) -> None:
        runs.write_json(self.path, self.cache)


def identity_document(entry: str, config: Mapping[str, Any], checksums: Checksums) -> dict[str, Any]:
    """What the stage's result depends on, readable: each run records it, so `plan` can say what changed."""
    config = json.loads(json.dumps(without_keys(without_later_defaults(entry, config), NOT_SHAPING.get(entry, ()))))
    for key in EXTERNAL_INPUTS.get(entry, ()):
        *path, last = key.split(".")
        node = functools.reduce(lambda n, k: n.get(k) if isinstance(n, dict) else None, path, config)
        if isinstance(node, dict) and node.get(last) is not None:
            node[last] = {"content": checksums.content(node[last])}
    return {"entry": entry, "config": config}


def identity_hash(document: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode("utf-8")).hexdigest()[:16]


@functools.cache
def code_files(entry: str) -> tuple[str, ...]:
    """The repository's source files that `entry`'s program imports, directly or not (imports in functions too)."""
    finder = modulefinder.ModuleFinder(path=[str(REPO_ROOT)])
    finder.run_script(str(REPO_ROOT / ENTRY_SCRIPTS[entry]))
    files = {Path(module.__file__).resolve() for module in finder.modules.values() if module.__file__}
    return tuple(sorted(str(f.relative_to(REPO_ROOT)) for f in files if f.is_relative_to(REPO_ROOT)))


@functools.cache
def code_version(entry: str) -> str | None:
    """A hash of the source of every module of this repository that the entry point imports (None: the report)."""
    if entry not in ENTRY_SCRIPTS:
        return None
    return files_sha256([REPO_ROOT / f for f in code_files(entry)], REPO_ROOT)[:12]


def package_versions() -> dict[str, str | None]:
    installed = {d.metadata["Name"].lower(): d.version for d in metadata.distributions()}
    return {name: installed.get(name) for name in PACKAGES}


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two identity documents."""
    a, b = dict(leaves(old)), dict(leaves(new))
    return sorted(key for key in set(a) | set(b) if a.get(key) != b.get(key))
