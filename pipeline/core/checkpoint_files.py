"""Which checkpoint files of a run are complete, and the newest of them: plain file checks, no torch.

The trainer (pipeline/train.py, through pipeline/pretraining/checks.py) picks the checkpoint to resume from, also
when the workflow continues an interrupted pre-training (ckpt_path=auto); plain file checks keep that decision
cheap, before anything heavy is imported.
"""
from __future__ import annotations

import logging
import zipfile
from pathlib import Path

PARTIAL_PREFIX, PARTIAL_SUFFIX = ".checkpoint-", ".partial"
log = logging.getLogger(__name__)


def is_complete(path: Path) -> bool:
    """A torch checkpoint whose zip directory (written last) is intact, or a DeepSpeed checkpoint directory
    whose `latest` tag (written after its shards) exists."""
    if path.is_dir():
        return (path / "latest").is_file()
    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def newest_complete_checkpoint(checkpoint_dir: Path, output_dir: Path) -> Path | None:
    """The most recently written complete checkpoint of a run: last.ckpt, step*.ckpt or a SLURM hpc_ckpt_*.ckpt."""
    candidates = [*Path(checkpoint_dir).glob("*.ckpt"), *Path(output_dir).glob("hpc_ckpt_*.ckpt")]
    for candidate in sorted(candidates, key=lambda p: p.stat().st_mtime_ns, reverse=True):
        if is_complete(candidate):
            return candidate
        log.warning("skipping %s: incomplete (its write was interrupted)", candidate)
    return None


def remove_partial_checkpoints(*directories: Path) -> list[Path]:
    """Temporary files of writes that were killed; nothing will ever complete them."""
    removed = []
    for directory in directories:
        for partial in Path(directory).glob(f"{PARTIAL_PREFIX}*{PARTIAL_SUFFIX}"):
            partial.unlink(missing_ok=True)
            removed.append(partial)
    return removed
