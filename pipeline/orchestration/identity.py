"""What a stage's result depends on, as one hash: its composed config (the resolved YAML of its entry point, so an
edit of any YAML file counts) without the keys that shape nothing, and the code version (the source of every module
of this repository its entry point imports). Snakemake sees the hash as a rule parameter, so a stage re-runs exactly
when it changes; the content of the stage's inputs enters through their sentinels (see stage.py).

Left out, because they shape no result: where things are written and read (the workflow wires them; the inputs'
content counts instead), W&B and progress settings, loader workers, checksum verification, checkpoint and logging
intervals, and the devices (a stage whose resources changed resumes its run rather than starting another). Paths
inside the checkout are written relative to it, so that a moved checkout re-runs nothing.
"""
from __future__ import annotations

import functools
import hashlib
import json
import modulefinder
from pathlib import Path
from typing import Any, Mapping

from pipeline.core.app import REPO_ROOT

# Keys of each entry point's composed config that do not enter its identity (a key names itself and everything
# below it).
_LOGGING = ("logger.mode", "logger.group", "logger.name", "logger.project", "logger.entity", "logger.tags",
            "logger.log_model", "trainer.enable_progress_bar", "trainer.enable_model_summary",
            "trainer.log_every_n_steps", "export.plot")
_DEVICES = ("trainer.devices", "trainer.num_nodes", "trainer.accelerator")
NOT_IDENTITY = {
    "data_prep": ("output_dir", "dask"),
    "train": ("output_dir", "data.path", "init_from_checkpoint", "ckpt_path", "data.num_workers",
              "data.verify_checksums", "callbacks", *_LOGGING, *_DEVICES),
    "finetune": ("output_dir", "init", "data.cache_dir", "data.num_workers", *_LOGGING, *_DEVICES),
    "export": (),
}
# The program each entry runs, whose imports make its code version.
ENTRY_SCRIPTS = {
    "data_prep": "data_prep/run.py",
    "train": "pipeline/train.py",
    "finetune": "pipeline/finetune.py",
    "export": "pipeline/orchestration/export_stage.py",
}
IDENTITY_LENGTH = 16


def without_keys(config: Mapping[str, Any], dotted_keys: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key in dotted_keys:
            continue
        nested = tuple(k.split(".", 1)[1] for k in dotted_keys if k.startswith(f"{key}."))
        out[key] = without_keys(value, nested) if isinstance(value, Mapping) and nested else value
    return out


def relative_paths(value: Any) -> Any:
    """Paths inside the checkout as `<repo>/...`: the same stage in another clone is the same stage."""
    root = str(REPO_ROOT)
    if isinstance(value, str):
        return "<repo>" + value[len(root):] if value == root or value.startswith(root + "/") else value
    if isinstance(value, Mapping):
        return {k: relative_paths(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [relative_paths(v) for v in value]
    return value


@functools.lru_cache(maxsize=None)
def code_files(entry: str) -> tuple[str, ...]:
    """The repository's source files that `entry`'s program imports, directly or not (static analysis, so imports
    inside functions count too), relative to the checkout."""
    finder = modulefinder.ModuleFinder(path=[str(REPO_ROOT)])
    finder.run_script(str(REPO_ROOT / ENTRY_SCRIPTS[entry]))
    files = {Path(module.__file__).resolve() for module in finder.modules.values() if module.__file__}
    return tuple(sorted(str(f.relative_to(REPO_ROOT)) for f in files if f.is_relative_to(REPO_ROOT)))


@functools.lru_cache(maxsize=None)
def code_version(entry: str) -> str:
    digest = hashlib.sha256()
    for name in code_files(entry):
        digest.update(name.encode() + b"\0" + (REPO_ROOT / name).read_bytes() + b"\0")
    return digest.hexdigest()[:IDENTITY_LENGTH]


def identity_document(entry: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """What the stage's result depends on, readable (it is written into each run directory, so that two versions of
    a stage can be compared)."""
    return {"entry": entry, "code_version": code_version(entry) if entry in ENTRY_SCRIPTS else None,
            "config": relative_paths(without_keys(config, NOT_IDENTITY.get(entry, ())))}


def identity_hash(document: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode("utf-8")).hexdigest()[:IDENTITY_LENGTH]


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two identity documents (for `workflow.action=plan`)."""
    keys = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            keys += changed_keys(a, b, f"{prefix}{key}.")
        elif a != b:
            keys.append(f"{prefix}{key}")
    return keys
