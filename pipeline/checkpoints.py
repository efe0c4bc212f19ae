"""Checkpoints that survive a kill during their own write, and finding the newest complete one to resume from.

Lightning's own writer stages a checkpoint in the system temp directory and moves it into place: a rename when
both are on one filesystem, but a copy (killable half-way, leaving a truncated file under the real name) when
the checkpoints live elsewhere, as they do on clusters (local /tmp, shared checkpoint storage). Here the bytes go
to a temporary file *in the checkpoint's own directory*, are fsynced, and replace the target with one atomic
rename; the previous checkpoint stays whole until then. Temporary names never contain "hpc_ckpt_", which
Lightning parses for the SLURM requeue's version number.
"""
from __future__ import annotations

import logging
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning.plugins.io import TorchCheckpointIO

PARTIAL_PREFIX, PARTIAL_SUFFIX = ".checkpoint-", ".partial"
log = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO whose local writes are atomic and durable (remote URLs: Lightning's own transaction)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path) and not str(path).startswith("file://"):
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(str(path).removeprefix("file://"))
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=PARTIAL_PREFIX, suffix=PARTIAL_SUFFIX)
        try:
            with os.fdopen(handle, "wb") as out:
                torch.save(checkpoint, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        _fsync_directory(target.parent)   # the rename itself survives a crash of the machine


def _fsync_directory(directory: Path) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:   # some filesystems do not sync directories; the rename is still atomic
        pass
    finally:
        os.close(descriptor)


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


def remove_partial_checkpoints(*directories: Path) -> list[Path]:
    """Temporary files of writes that were killed; nothing will ever complete them."""
    removed = []
    for directory in directories:
        for partial in Path(directory).glob(f"{PARTIAL_PREFIX}*{PARTIAL_SUFFIX}"):
            partial.unlink(missing_ok=True)
            removed.append(partial)
    return removed


def newest_complete_checkpoint(checkpoint_dir: Path, output_dir: Path) -> Path | None:
    """The most recently written complete checkpoint of a run: last.ckpt, step*.ckpt or a SLURM hpc_ckpt_*.ckpt."""
    candidates = [*Path(checkpoint_dir).glob("*.ckpt"), *Path(output_dir).glob("hpc_ckpt_*.ckpt")]
    for candidate in sorted(candidates, key=lambda p: p.stat().st_mtime_ns, reverse=True):
        if is_complete(candidate):
            return candidate
        log.warning("skipping %s: incomplete (its write was interrupted)", candidate)
    return None
