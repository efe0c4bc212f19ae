"""A stage's run directories and its sentinel: the files through which stages hand their results on.

    <root>/<stage>/<version>/        one run directory per version of the stage, never removed by the workflow
    <root>/<stage>/current           link to the run directory of the latest finished run
    <root>/<stage>/DONE.json         the sentinel: the rule's output (Snakemake removes it before the rule runs again)

A version is a hash of the stage's identity (config, external inputs' content) and its inputs' content, so a changed
config starts a new directory beside the old one, and the same config on the same inputs (an interrupted run, a SLURM
requeue, a relaunch after a code edit) goes back to its own directory. Each run directory holds workflow_stage.json:
what it was made from, with which code and packages, and each attempt.

The sentinel holds only the content identity of the stage's result (the shard checksums, the final checkpoint, the
model's files, the scores): Snakemake compares a small input's checksum with the one its reader last ran on, so a
stage that ran again and made the same content does not make its readers run again.
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
LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"


def sentinel_path(root: Path, stage: str) -> Path:
    return Path(root) / stage / SENTINEL


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def write_json(path: Path, record: Any) -> None:
    """Readers see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(record, indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def version_name(identity: str, input_contents: Mapping[str, str], rerun: str | None = None) -> str:
    record = {"identity": identity, "inputs": dict(sorted(input_contents.items()))}
    record.update({"rerun": rerun} if rerun else {})     # a run on new code, asked for: a directory of its own
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode("utf-8")).hexdigest()[:12]


def runs_of(stage_dir: Path, identity: str) -> list[tuple[Path, dict]]:
    """(run directory, record) of each run of this identity of a stage (not through `current`, the link)."""
    return [(path.parent, record) for path in stage_dir.glob(f"*/{RECORD}") if not path.parent.is_symlink()
            and (record := read_json(path) or {}).get("identity") == identity]


def point_current(stage_dir: Path, run_dir: Path) -> None:
    temporary = stage_dir / f".{CURRENT}.{os.getpid()}"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(run_dir.name)          # relative: the workflow root may be moved or mounted elsewhere
    os.replace(temporary, stage_dir / CURRENT)


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def _hash_files(paths: list[Path], base: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.relative_to(base)).encode() + b"\0")
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


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
        checkpoint = run_dir / LAST_CHECKPOINT
        if not checkpoint.exists():                       # nothing for a reader; never the hash of nothing
            raise FileNotFoundError(f"{checkpoint} not found: the run left no final checkpoint to hand on")
        files = [checkpoint] if checkpoint.is_file() else [p for p in checkpoint.rglob("*") if p.is_file()]
        return _hash_files(files, run_dir)
    if entry == "export":
        return _hash_files([p for p in run_dir.iterdir() if p.is_file() and p.name != RECORD
                            and not p.name.endswith(".log")], run_dir)
    if entry == "finetune":
        metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
        return hashlib.sha256(json.dumps(metrics.get("metrics"), sort_keys=True).encode()).hexdigest()
    raise ValueError(f"no content identity for entry {entry!r}")
