"""What a stage's result depends on, as one hash: its composed config (the resolved YAML of its entry point, so an
edit of any YAML file counts) without the keys that shape nothing, with the files it reads from outside the
workflow (corpus, vocabulary, held-out shards, GLUE/SQuAD files) by their content, not their path. Snakemake sees
the hash as the rule's parameter, so a stage re-runs exactly when it changes; what it reads from earlier stages
counts through their sentinels (runs.py).

Not in it: the code. A code edit (a comment, a `git pull`) must not restart a run of days: the code version and the
versions of the main packages are recorded in every run and shown by `workflow.action=plan`, and a stage runs
again on new code only when asked (workflow.rerun_code_changed).
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
from typing import Any, Iterator, Mapping

from pipeline.core.app import REPO_ROOT
from pipeline.orchestration import runs

# The one list of what shapes no result, per entry point (a key names itself and everything below it). Each key has a
# test (tests/orchestration/test_identity.py) that changing it keeps the identity; every other key changes it.
_LOGGING = ("logger.mode", "logger.group", "logger.name", "logger.project", "logger.entity", "logger.tags",
            "logger.log_model", "trainer.enable_progress_bar", "trainer.enable_model_summary",
            "trainer.log_every_n_steps", "export.plot", "export.hf")
_DEVICES = ("trainer.devices", "trainer.num_nodes", "trainer.accelerator")     # a resized stage resumes its run
NOT_SHAPING = {
    # where it runs and writes; corpus_root counts through the inputs' content
    "data_prep": ("output_dir", "dask", "corpus_root"),
    # wired paths (their content counts through the inputs), memory and speed only (the global batch is the
    # recipe, split into passes that fit; padding; cuDNN autotuning), when to validate (draws nothing from the
    # training RNG) or checkpoint, what is logged and plotted
    "train": ("output_dir", "data.path", "init_from_checkpoint", "ckpt_path", "data.num_workers",
              "data.verify_checksums", "data.micro_batch_size", "data.pad_to_multiple_of", "trainer.benchmark",
              "validation.every_n_steps", "callbacks.checkpoint.every_n_train_steps",
              "callbacks.checkpoint.save_last", "callbacks.throughput", *_LOGGING, *_DEVICES),
    "finetune": ("output_dir", "init", "data.cache_dir", "data.num_workers", "data.eval_batch_size",
                 "data.pad_to_multiple_of", *_LOGGING, *_DEVICES),
    "export": (),
}
# Paths to files from outside the workflow: they enter the identity by their content.
EXTERNAL_INPUTS = {"data_prep": ("inputs", "vocab.file"), "train": ("validation.path",),
                   "finetune": ("data.dir", "data.train", "data.dev", "data.test", "tokenizer")}
ENTRY_SCRIPTS = {"data_prep": "data_prep/run.py", "train": "pipeline/train.py", "finetune": "pipeline/finetune.py",
                 "export": "pipeline/orchestration/export_stage.py"}
PACKAGES = ("torch", "pytorch-lightning", "deepspeed", "transformers", "tokenizers")
IDENTITY_LENGTH = 16


def leaves(config: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested mapping."""
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def without_keys(config: Mapping[str, Any], dotted_keys: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key in dotted_keys:
            continue
        nested = tuple(k.split(".", 1)[1] for k in dotted_keys if k.startswith(f"{key}."))
        out[key] = without_keys(value, nested) if isinstance(value, Mapping) and nested else value
    return out


class Checksums:
    """sha256 of local files, re-hashed only when a file's size or modification time changed (a corpus of 20 GB is
    read once); the cache lives in the workflow's state directory."""

    def __init__(self, path: Path):
        self.path, self.cache = path, runs.read_json(path) or {}

    def content(self, value: Any) -> Any:
        """A path, glob, or list of them (data prep's inputs: {path: ..., format: ...}) by content."""
        if isinstance(value, list):
            return [self.content(v) for v in value]
        if isinstance(value, Mapping):
            return {k: self.content(v) if k == "path" else v for k, v in value.items()}
        if not isinstance(value, str) or "://" in value:
            return value                              # null, or a remote path (a hub name, gs://): as given
        found = sorted(glob.glob(value, recursive=True)) if glob.has_magic(value) else [value]
        files = [f for p in found for f in ([p] if os.path.isfile(p) else
                                            sorted(str(q) for q in Path(p).rglob("*") if q.is_file()))]
        digest = hashlib.sha256()
        for name in files:
            digest.update(f"{os.path.relpath(name, value if os.path.isdir(value) else os.path.dirname(name))}\0"
                          f"{self._sha256(name)}\0".encode())
        return {"files": len(files), "sha256": digest.hexdigest()}

    def _sha256(self, name: str) -> str:
        stat = os.stat(name)
        key, stamp = os.path.realpath(name), [stat.st_size, stat.st_mtime_ns]
        if (self.cache.get(key) or {}).get("stamp") != stamp:
            digest = hashlib.sha256()
            with open(name, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            self.cache[key] = {"stamp": stamp, "sha256": digest.hexdigest()}
        return self.cache[key]["sha256"]

    def save(self) -> None:
        runs.write_json(self.path, self.cache)


def identity_document(entry: str, config: Mapping[str, Any], checksums: Checksums) -> dict[str, Any]:
    """What the stage's result depends on, readable (each run directory records it, so that two versions of a stage
    can be compared)."""
    config = json.loads(json.dumps(without_keys(config, NOT_SHAPING.get(entry, ()))))
    for key in EXTERNAL_INPUTS.get(entry, ()):
        head, _, last = key.rpartition(".")
        node = functools.reduce(lambda n, k: n.get(k) if isinstance(n, Mapping) else None, head.split(".") if head
                                else [], config)
        if isinstance(node, dict) and node.get(last) is not None:
            node[last] = {"content": checksums.content(node[last])}
    return {"entry": entry, "config": relative_paths(config)}


def relative_paths(value: Any) -> Any:
    """Paths inside the checkout as `<repo>/...`: the same stage in another clone is the same stage."""
    root = str(REPO_ROOT)
    if isinstance(value, str):
        return "<repo>" + value[len(root):] if value == root or value.startswith(root + "/") else value
    if isinstance(value, Mapping):
        return {k: relative_paths(v) for k, v in value.items()}
    return [relative_paths(v) for v in value] if isinstance(value, list) else value


def identity_hash(document: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode("utf-8")).hexdigest()[:IDENTITY_LENGTH]


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
    """A hash of the source of every module of this repository that the entry point imports (None: report)."""
    if entry not in ENTRY_SCRIPTS:
        return None
    digest = hashlib.sha256()
    for name in code_files(entry):
        digest.update(name.encode() + b"\0" + (REPO_ROOT / name).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def package_versions() -> dict[str, str | None]:
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None
    return {name: version(name) for name in PACKAGES}


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two identity documents."""
    keys = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            keys += changed_keys(a, b, f"{prefix}{key}.")
        elif a != b:
            keys.append(f"{prefix}{key}")
    return keys
