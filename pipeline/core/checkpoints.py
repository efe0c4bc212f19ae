"""Checkpoints that survive a kill during their own write (finding the newest complete one: checkpoint_files.py).

Lightning's own writer stages a checkpoint in the system temp directory and moves it into place: a rename when
both are on one filesystem, but a copy (killable half-way, leaving a truncated file under the real name) when
the checkpoints live elsewhere, as they do on clusters (local /tmp, shared checkpoint storage). Here the bytes go
to a temporary file *in the checkpoint's own directory* and replace the target atomically (atomic_files.py); the
previous checkpoint stays whole until then.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pytorch_lightning.plugins.io import TorchCheckpointIO

from pipeline.core.atomic_files import atomic_file


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO whose local writes are atomic and durable (remote URLs: Lightning's own transaction)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path) and not str(path).startswith("file://"):
            return super().save_checkpoint(checkpoint, path, storage_options)
        with atomic_file(Path(str(path).removeprefix("file://"))) as out:
            torch.save(checkpoint, out)
