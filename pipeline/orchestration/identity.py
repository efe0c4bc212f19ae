"""What a stage's result depends on, as one hash (the rule's parameter, so Snakemake re-runs a stage exactly when it
changes): its composed config (any YAML edit that reaches it counts) minus the keys that shape nothing
(pipeline/core/shaping.py says which, and why: a pre-training's loader workers, pass size and devices shape its data
stream; compile, padding and validation do not), with the files it reads from outside the workflow (corpus,
vocabulary, GLUE/SQuAD files) by their content, not their path. What it reads from earlier stages counts through
their sentinels (runs.py).

Not the code: a comment or a `git pull` must not restart a run of days. The code version and the main packages'
versions are recorded in each run and shown by `plan`; a stage runs again on new code only when asked
(workflow.rerun_code_changed).
"""
from __future__ import annotations

import functools
import glob
import hashlib
import json
import modulefinder
import os
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from pipeline.core.app import REPO_ROOT
from pipeline.core.shaping import OPERATIONAL, leaves, without_keys
from pipeline.orchestration import runs

# What shapes no result, per entry point: the operational keys (pipeline/core/shaping.py, the list a resume's check
# reads too), and the paths the workflow wires from earlier stages, whose content counts through their sentinels.
# Each key has a test that changing it keeps the identity, every other key one that it changes it
# (tests/orchestration/test_identity.py).
WIRED_INPUTS = {"train": ("data.path", "init_from_checkpoint"), "finetune": ("init",)}
NOT_SHAPING = {entry: (*keys, *WIRED_INPUTS.get(entry, ())) for entry, keys in OPERATIONAL.items()}
# Paths to files from outside the workflow: they count by their content.
EXTERNAL_INPUTS = {"data_prep": ("inputs", "vocab.file"),
                   "finetune": ("data.dir", "data.train", "data.dev", "data.test", "tokenizer")}
ENTRY_SCRIPTS = {"data_prep": "data_prep/run.py", "train": "pipeline/train.py", "finetune": "pipeline/finetune.py",
                 "export": "pipeline/orchestration/export_stage.py"}
PACKAGES = ("torch", "pytorch-lightning", "deepspeed", "transformers", "tokenizers")


class Checksums:
    """sha256 of local files, cached in the workflow's state directory (a 20 GB corpus is read once) and hashed again
    when a file's inode, size, mtime or ctime changed. Not size and mtime alone: `cp -p`, `rsync -a` or `touch -r`
    put those back over new bytes, while a write, a replacement or a utime call gives a new ctime (or inode), which
    only the kernel sets. Not the device number, which differs between the nodes a controller may run on for the
    same NFS file. `rehash` (workflow.rehash_inputs=true): every file hashed again, whatever the cache says."""

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
        stat, key = os.stat(name), os.path.realpath(name)   # before reading: a write meanwhile moves the ctime
        stamp = [stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]
        if (self.cache.get(key) or {}).get("stamp") != stamp:
            with open(name, "rb") as handle:
                digest = hashlib.file_digest(handle, "sha256").hexdigest()
            self.cache[key] = {"stamp": stamp, "sha256": digest}
        return self.cache[key]["sha256"]

    def save(self) -> None:
        runs.write_json(self.path, self.cache)


def identity_document(entry: str, config: Mapping[str, Any], checksums: Checksums) -> dict[str, Any]:
    """What the stage's result depends on, readable: each run records it, so `plan` can say what changed."""
    config = json.loads(json.dumps(without_keys(config, NOT_SHAPING.get(entry, ()))))
    for key in EXTERNAL_INPUTS.get(entry, ()):
        *path, last = key.split(".")
        node = functools.reduce(lambda n, k: n.get(k) if isinstance(n, dict) else None, path, config)
        if isinstance(node, dict) and node.get(last) is not None:
            node[last] = {"content": checksums.content(node[last])}
    return {"entry": entry, "config": config}


def identity_hash(document: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode("utf-8")).hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def code_files(entry: str) -> tuple[str, ...]:
    """The repository's source files that `entry`'s program imports, directly or not (static analysis, so imports
    inside functions count too), relative to the checkout."""
    finder = modulefinder.ModuleFinder(path=[str(REPO_ROOT)])
    finder.run_script(str(REPO_ROOT / ENTRY_SCRIPTS[entry]))
    files = {Path(module.__file__).resolve() for module in finder.modules.values() if module.__file__}
    return tuple(sorted(str(f.relative_to(REPO_ROOT)) for f in files if f.is_relative_to(REPO_ROOT)))


@functools.lru_cache(maxsize=None)
def code_version(entry: str) -> str | None:
    """A hash of the source of every module of this repository that the entry point imports (None: the report)."""
    if entry not in ENTRY_SCRIPTS:
        return None
    digest = hashlib.sha256()
    for name in code_files(entry):
        digest.update(name.encode() + b"\0" + (REPO_ROOT / name).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def package_versions() -> dict[str, str | None]:
    installed = {d.metadata["Name"].lower(): d.version for d in metadata.distributions()}
    return {name: installed.get(name) for name in PACKAGES}


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two identity documents."""
    a, b = dict(leaves(old)), dict(leaves(new))
    return sorted(key for key in set(a) | set(b) if a.get(key) != b.get(key))
