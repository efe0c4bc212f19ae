"""Which checkpoints of a run are complete, and the newest of them (its highest step): plain file checks, no torch.

Two kinds of checkpoint:
- a torch file (DDP, one process): complete when its zip directory (written last) is intact. Writes go to a
  temporary file beside it and replace it by a rename (pipeline/core/checkpoints/lightning_checkpoints.py), so a killed
  write leaves the previous file whole.
- a DeepSpeed directory (one shard per rank): DeepSpeed writes `<dir>/<tag>/*` and a `latest` file naming the tag.
  Our strategies (pipeline/core/checkpoints/deepspeed_checkpoints.py) write every save under a new tag beside the
  previous one, and only after every rank's files are on disk record them (`<tag>/complete.json`: each file's size) and
  switch `latest` to the new tag with one atomic rename. A directory is complete when the tag `latest` names has that
  record and every file in it still has its recorded size: a save killed half-way, or a shard cut short afterwards, does
  not count.

The trainer (pipeline/train.py, through pipeline/pretraining/checks.py) picks the checkpoint to resume from, also at
every start of a SLURM job (ckpt_path=auto, infra/slurm/train.sbatch) and when the workflow continues an interrupted
pre-training; plain file checks keep that decision cheap, before anything heavy is imported, and the refusals that
follow from it (a start from step 0 over checkpoints none of which is complete: fresh_start.py; a resume from an
earlier step than the run's later checkpoints: rollback.py). The newest is the one of the highest step
(checkpoint_steps.py), not the one modified last: a `touch` or a copy changes mtimes. A checkpoint this user may not
read (a `latest`, a record, a torch file, the directory itself: e.g. written with mode 0600 by another user) stops
that decision with UnreadableCheckpoint, naming the file: passing over it would resume from an older checkpoint, or
start the run over, without a word.

    python -m pipeline.core.checkpoints.checkpoint_files <run dir>  # newest complete one; exit 1: none, 2: unreadable
"""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import sys
import zipfile
from pathlib import Path

from pipeline.core.checkpoints.checkpoint_steps import recorded_step

PARTIAL_PREFIX, PARTIAL_SUFFIX = ".checkpoint-", ".partial"
LATEST = "latest"                   # DeepSpeed's pointer to the tag of a checkpoint directory
COMPLETION_RECORD = "complete.json"   # inside a tag: written after every rank's files, before `latest` names it
CHECKPOINT_DIR = "checkpoints"               # a pre-training run's checkpoints, under its output directory
log = logging.getLogger(__name__)


class UnreadableCheckpoint(PermissionError):
    """A file of a run's checkpoints that this process may not read."""

    def __init__(self, path: Path):
        super().__init__(
            errno.EACCES, f"cannot read {path}: whether the run's checkpoints are complete, and which to resume from, "
            "cannot be told. Make them readable to the user that resumes the run (e.g. `chmod -R g+rX` on the run's "
            "checkpoints/ for a project group: earlier versions wrote last.ckpt and DeepSpeed's `latest` with mode "
            "0600), or resume as the user that wrote them", str(path))
        self.path = path

    def __str__(self) -> str:
        return self.strerror


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except PermissionError:
        raise UnreadableCheckpoint(path) from None


def _require_access(path: Path, mode: int) -> None:
    if not os.access(path, mode):
        raise UnreadableCheckpoint(path)


def checkpoint_problem(path: Path) -> str | None:
    """None when the checkpoint at `path` is complete, else why it is not (for the log). Raises UnreadableCheckpoint
    where a file of it may not be read."""
    path = Path(path)
    if path.is_dir():
        return _directory_problem(path)
    try:
        with zipfile.ZipFile(path) as archive:
            if archive.namelist():
                return None
    except PermissionError:
        raise UnreadableCheckpoint(path) from None
    except (OSError, zipfile.BadZipFile):
        pass
    return "not a whole torch checkpoint (its zip directory is missing: the write was cut short)"


def is_complete(path: Path) -> bool:
    return checkpoint_problem(path) is None


def _directory_problem(path: Path) -> str | None:
    latest = path / LATEST
    if not latest.is_file():
        return f"no `{LATEST}` file: its save never finished"
    tag = _read_text(latest).strip()
    tag_dir = path / tag
    if not tag or not tag_dir.is_dir():
        return f"`{LATEST}` names {tag!r}, which is not there"
    record_path = tag_dir / COMPLETION_RECORD
    if not record_path.is_file():
        return _unrecorded_problem(tag_dir)
    try:
        files = json.loads(_read_text(record_path))["files"]
    except UnreadableCheckpoint:
        raise
    except (OSError, ValueError, KeyError, TypeError):
        return f"its completion record {record_path.name} is unreadable"
    for name, size in sorted(files.items()):
        file = tag_dir / name
        if not file.is_file():
            return f"{tag}/{name} is missing"
        if file.stat().st_size != size:
            return (f"{tag}/{name} has {file.stat().st_size} bytes, its completion record says {size} (cut short "
                    "or rewritten after the save)")
        _require_access(file, os.R_OK)   # else DeepSpeed's loader fails deep inside, once every rank has started
    return None


def _unrecorded_problem(tag_dir: Path) -> str | None:
    """A directory written before completion records (or by another program): every torch file in its tag must at
    least be a whole zip archive (a shard cut short is not); whether every rank's shard is there cannot be told."""
    files = sorted(tag_dir.rglob("*.pt"))
    if not files:
        return f"{tag_dir.name}/ holds no model or optimizer files"
    for file in files:
        if checkpoint_problem(file) is not None:
            return f"{tag_dir.name}/{file.relative_to(tag_dir)} is not a whole torch file (cut short)"
    log.warning("%s has no completion record (written by an older version): its files are whole, but whether "
                "every rank's shard is there cannot be checked", tag_dir.parent)
    return None


def written_at(path: Path) -> int:
    """When a checkpoint was completed (ns): a file's mtime; a DeepSpeed directory's `latest` (switched last)."""
    path = Path(path)
    latest = path / LATEST
    if path.is_dir() and latest.is_file():
        return latest.stat().st_mtime_ns
    return path.stat().st_mtime_ns


def newest_complete_checkpoint(checkpoint_dir: Path, output_dir: Path) -> Path | None:
    """The complete checkpoint of a run that holds its highest step (checkpoint_steps.py; of two at one step, the one
    completed last): last.ckpt, step*.ckpt or a SLURM hpc_ckpt_*.ckpt (written by earlier versions). Each of a
    higher step that is not complete is logged with the reason it was passed over, and a checkpoint of a lower step
    completed after the one chosen (by mtime: touched, copied) with the order the step gives."""
    candidates = run_checkpoints(checkpoint_dir, output_dir)
    order = {candidate: (_step_or_lowest(candidate), written_at(candidate)) for candidate in candidates}
    for candidate in sorted(candidates, key=order.get, reverse=True):
        problem = checkpoint_problem(candidate)
        if problem is None:
            _say_where_mtime_disagrees(candidate, order)
            return candidate
        log.warning("not resuming from %s: %s", candidate, problem)
    return None


def run_checkpoints(checkpoint_dir: Path, output_dir: Path) -> list[Path]:
    """Every checkpoint of a run, complete or not: checkpoints/*.ckpt (files or DeepSpeed directories) and the SLURM
    hpc_ckpt_*.ckpt of earlier versions beside them. Not what is in folders below checkpoints/ (a rollback's,
    rollback.py). Raises UnreadableCheckpoint for a folder this process may not list."""
    for directory in (Path(checkpoint_dir), Path(output_dir)):
        if directory.is_dir():
            _require_access(directory, os.R_OK | os.X_OK)   # glob would see nothing in it: a start from scratch
    return sorted([*Path(checkpoint_dir).glob("*.ckpt"), *Path(output_dir).glob("hpc_ckpt_*.ckpt")])


def _step_or_lowest(checkpoint: Path) -> int:
    try:
        step = recorded_step(checkpoint)
    except PermissionError as error:
        raise UnreadableCheckpoint(Path(error.filename or checkpoint)) from None
    return -1 if step is None else step   # one that says no step: after every one that does, by mtime among them


def _say_where_mtime_disagrees(chosen: Path, order: dict[Path, tuple[int, int]]) -> None:
    step, completed = order[chosen]
    later = [c for c, (s, t) in order.items() if s < step and t > completed]
    if later:
        touched = max(later, key=lambda c: order[c][1])
        log.warning("newest checkpoint: %s, of step %d, the highest; %s, of step %d, was modified after it (a "
                    "touch, a copy, or a run resumed from an earlier checkpoint), which does not make it newer",
                    chosen, step, touched.name, order[touched][0])


def remove_partial_checkpoints(*directories: Path) -> list[Path]:
    """What interrupted saves left, which nothing will ever complete: temporary files of torch checkpoints, and in
    DeepSpeed checkpoint directories the tags that `latest` does not name (a save killed before its switch, or the
    previous tag when the kill came between the switch and its removal)."""
    removed = []
    for directory in directories:
        for partial in Path(directory).glob(f"{PARTIAL_PREFIX}*{PARTIAL_SUFFIX}"):
            partial.unlink(missing_ok=True)
            removed.append(partial)
        for checkpoint in Path(directory).glob("*.ckpt"):
            for tag_dir in stale_tags(checkpoint):
                shutil.rmtree(tag_dir, ignore_errors=True)
                removed.append(tag_dir)
    return removed


def stale_tags(checkpoint: Path) -> list[Path]:
    """The tag directories of a DeepSpeed checkpoint directory that its `latest` does not name (DeepSpeed's: holding
    model or optimizer states; anything else a user put there stays)."""
    latest = Path(checkpoint) / LATEST
    if not latest.is_file():
        return []
    current = _read_text(latest).strip()
    return [tag_dir for tag_dir in sorted(Path(checkpoint).iterdir())
            if tag_dir.is_dir() and tag_dir.name != current
            and (any(tag_dir.glob("*model_states.pt")) or any(tag_dir.glob("*optim_states.pt")))]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    try:
        newest = newest_complete_checkpoint(run_dir / CHECKPOINT_DIR, run_dir) if run_dir.is_dir() else None
    except UnreadableCheckpoint as error:
        print(error, file=sys.stderr)
        return 2
    if newest is None:
        return 1
    print(newest)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    sys.exit(main())
