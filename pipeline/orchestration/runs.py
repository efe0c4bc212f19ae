"""The files through which stages hand on their results: run directories <root>/<stage>/<version>/, `current`, the
sentinel DONE.json (the rule's output: the result's content identity); the one finished-run reader."""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from data_prep.content_identity import shard_set_content
from pipeline.core.checkpoints.atomic_files import write_atomically
from pipeline.core.file_stamp import files_sha256

SENTINEL = "DONE.json"
CURRENT = "current"
RECORD = "workflow_stage.json"
LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"


def sentinel_path(root: Path, stage: str) -> Path:
    return Path(root) / stage / SENTINEL


def finished_run(root: Path, stage: str) -> tuple[Path, dict] | None:
    """(run directory, record) of the finished run the stage's sentinel names; None if none, or `current` differs."""
    sentinel, run_dir = read_json(sentinel_path(root, stage)), (Path(root) / stage / CURRENT).resolve()
    record = read_json(run_dir / RECORD) or {}
    if sentinel is None or not record.get("finished") or record.get("content") != sentinel.get("content"):
        return None
    return run_dir, record


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def write_json(path: Path, record: Any) -> None:
    write_atomically(path, json.dumps(record, indent=2) + "\n")      # readers see the old file or the new one


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
    return _dt.datetime.now(_dt.UTC).astimezone().isoformat(timespec="seconds")


def content_identity(entry: str, run_dir: Path) -> str:
    """What a stage's readers read, as a hash: data prep the shard checksums of its manifest (and the tokenizer);
    pre-training its final checkpoint; export the model directory; fine-tuning its scores."""
    if entry == "data_prep":
        return shard_set_content(json.loads((run_dir / "manifest.json").read_text(encoding="utf-8")))
    if entry == "train":
        checkpoint = run_dir / LAST_CHECKPOINT
        if not checkpoint.exists():                       # nothing for a reader; never the hash of nothing
            raise FileNotFoundError(f"{checkpoint} not found: the run left no final checkpoint to hand on")
        files = [checkpoint] if checkpoint.is_file() else [p for p in checkpoint.rglob("*") if p.is_file()]
        return files_sha256(files, run_dir)
    if entry == "export":
        return files_sha256([p for p in run_dir.iterdir() if p.is_file() and p.name != RECORD
                            and not p.name.endswith(".log")], run_dir)
    if entry == "finetune":
        metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
        return hashlib.sha256(json.dumps(metrics.get("metrics"), sort_keys=True).encode()).hexdigest()
    raise ValueError(f"no content identity for entry {entry!r}")
