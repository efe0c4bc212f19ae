"""A stage's run directories and its sentinel: the files through which stages hand their results on.

    <root>/<stage>/<version>/        one run directory per version of the stage, never removed by the workflow
    <root>/<stage>/current           link to the version the latest finished run made (a path that does not move)
    <root>/<stage>/DONE.json         the sentinel: Snakemake's output of the stage's rule (it removes it before the
                                     rule runs again; nothing else of the stage is a declared output)

A version is named by a hash of the stage's identity (its composed config and code version) and the content of its
inputs, so a changed config starts a new directory beside the old one, and the same config on the same inputs (an
interrupted run, a SLURM requeue, a re-run whose inputs came out the same) goes back to its own directory. Each run
directory holds workflow_stage.json: what it was made from and when.

The sentinel holds what a downstream stage needs and nothing that changes from one run to the next: the run
directory and the content identity of what is in it (the shard manifest's checksums, the model's files, the
scores). Snakemake compares a small input's checksum with the one its reader last ran on, so a stage run again
that made the same content does not make its readers run again on a later launch.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

SENTINEL = "DONE.json"
CURRENT = "current"
RECORD = "workflow_stage.json"
VERSION_LENGTH = 12


def sentinel_path(root: Path, stage: str) -> Path:
    return Path(root) / stage / SENTINEL


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def write_json(path: Path, record: Mapping[str, Any]) -> None:
    """Readers see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(record, indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def version_name(identity: str, input_contents: Mapping[str, str]) -> str:
    record = json.dumps({"identity": identity, "inputs": dict(sorted(input_contents.items()))}, sort_keys=True)
    return hashlib.sha256(record.encode("utf-8")).hexdigest()[:VERSION_LENGTH]


def point_current(stage_dir: Path, run_dir: Path) -> None:
    link = stage_dir / CURRENT
    temporary = stage_dir / f".{CURRENT}.{os.getpid()}"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(run_dir.name)          # relative: the workflow root may be moved or mounted elsewhere
    os.replace(temporary, link)


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


# ------------------------------------------------------------------------------------------------------------
# content identity of a stage's result

def _hash_files(paths: list[Path], base: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.relative_to(base)).encode() + b"\0")
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _tree(path: Path) -> list[Path]:
    return [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]


def content_identity(entry: str, run_dir: Path) -> str:
    """What a stage's readers read, as a hash: data prep the shard checksums of its manifest (and the tokenizer);
    pre-training its final checkpoint; export the model directory; fine-tuning its scores."""
    if entry == "data_prep":
        manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
        tokenizer = manifest.get("tokenizer") or {}
        record = {"shards": manifest.get("shards"),        # index, rows and each file's size and sha256
                  "tokenizer": {k: tokenizer.get(k) for k in ("vocab_sha256", "vocab_size", "lowercase")}}
        return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    if entry == "train":
        checkpoint = run_dir / "checkpoints" / "last.ckpt"
        return _hash_files(_tree(checkpoint), run_dir)
    if entry == "export":
        return _hash_files([p for p in run_dir.iterdir() if p.is_file() and p.name != RECORD
                            and not p.name.endswith(".log")], run_dir)
    if entry == "finetune":
        metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
        return hashlib.sha256(json.dumps(metrics.get("metrics"), sort_keys=True).encode()).hexdigest()
    raise ValueError(f"no content identity for entry {entry!r}")
