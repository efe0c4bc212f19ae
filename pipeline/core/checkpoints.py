"""Checkpoints that survive a kill during their own write (finding the newest complete one: checkpoint_files.py).

Lightning's own writer stages a checkpoint in the system temp directory and moves it into place: a rename when
both are on one filesystem, but a copy (killable half-way, leaving a truncated file under the real name) when
the checkpoints live elsewhere, as they do on clusters (local /tmp, shared checkpoint storage). Here the bytes go
to a temporary file *in the checkpoint's own directory* and replace the target atomically (atomic_files.py); the
previous checkpoint stays whole until then.

ResumingModelCheckpoint: Lightning's ModelCheckpoint, which forgets on resume which step it saved last.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.plugins.io import TorchCheckpointIO

from pipeline.core.atomic_files import atomic_file


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO whose local writes are atomic and durable (remote URLs: Lightning's own transaction)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path) and not str(path).startswith("file://"):
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(str(path).removeprefix("file://"))
        try:
            with atomic_file(target) as out:
                torch.save(checkpoint, out)
        except (OSError, RuntimeError) as error:
            # A full disk or quota ends torch's write as "[enforce fail at inline_container.cc] unexpected pos A vs B",
            # which names neither the file nor the cause.
            existing = next(folder for folder in target.parents if folder.exists())   # its folder may not be made
            free = shutil.disk_usage(existing).free / 2**30
            raise OSError(f"checkpoint {target} not written ({error}); {free:.2f} GiB free on its filesystem (a full "
                          "disk, a quota or a file-size limit ends the write like this); the one before it is "
                          "untouched") from error


class ResumingModelCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that does not save again the step a resumed fit starts at. Lightning's starts every fit with
    "last saved at step 0", so with gradient accumulation a fit resumed at a multiple of every_n_train_steps would
    save at its first micro-batch, the optimizer step not yet taken: it would overwrite the very checkpoint it resumed
    from (and last.ckpt) with a state in the middle of a step, whose accumulated gradient it does not hold, so a
    resume from it would not be exact."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # 0 on a fresh start, as Lightning's; a resumed fit's step is the checkpoint it resumed from, saved already
        self._last_global_step_saved = trainer.global_step
