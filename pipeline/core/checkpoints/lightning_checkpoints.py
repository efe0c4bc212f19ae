"""Checkpoints that survive a kill during their own write (finding the newest complete one: checkpoint_files.py).

Lightning's own writer stages a checkpoint in the system temp directory and moves it into place: a rename when
both are on one filesystem, but a copy (killable half-way, leaving a truncated file under the real name) when
the checkpoints live elsewhere, as they do on clusters (local /tmp, shared checkpoint storage). Here the bytes go
to a temporary file *in the checkpoint's own directory* and replace the target atomically (atomic_files.py); the
previous checkpoint stays whole until then.

ResumingModelCheckpoint: Lightning's ModelCheckpoint, which forgets on resume which step it saved last, and keeps
the periodic checkpoints that callbacks.checkpoint.keep_last / keep_every_n_steps say (checkpoint_retention.py).

Files are written with the mode a plain write gives (0666 less the umask: atomic_files.py), so a project group can
read them; one this user may not read stops a resume with UnreadableCheckpoint, naming it (checkpoint_files.py).
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.plugins.io import TorchCheckpointIO

from pipeline.core.checkpoints.atomic_files import atomic_file
from pipeline.core.checkpoints.checkpoint_files import UnreadableCheckpoint
from pipeline.core.checkpoints.checkpoint_retention import Retention, step_checkpoints

log = logging.getLogger(__name__)


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

    def load_checkpoint(self, path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return super().load_checkpoint(path, *args, **kwargs)
        except PermissionError:   # torch.load's, from deep inside Lightning's restore
            raise UnreadableCheckpoint(Path(str(path))) from None


class ResumingModelCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that does not save again the step a resumed fit starts at. Lightning's starts every fit with
    "last saved at step 0", so with gradient accumulation a fit resumed at a multiple of every_n_train_steps would
    save at its first micro-batch, the optimizer step not yet taken: it would overwrite the very checkpoint it resumed
    from (and last.ckpt) with a state in the middle of a step, whose accumulated gradient it does not hold, so a
    resume from it would not be exact.

    retention: which periodic checkpoints to keep (default: all). Right after each periodic save, every rank asks the
    strategy to remove the others (`trainer.strategy.remove_checkpoint`: global rank 0 removes the file or the
    DeepSpeed directory, the other ranks nothing)."""

    def __init__(self, *args: Any, retention: Retention | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.retention = retention or Retention()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # 0 on a fresh start, as Lightning's; a resumed fit's step is the checkpoint it resumed from, saved already
        self._last_global_step_saved = trainer.global_step

    def _save_topk_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict[str, Any]) -> None:
        # Lightning's one path to a periodic checkpoint (after a step, a validation or an epoch); last.ckpt follows.
        super()._save_topk_checkpoint(trainer, monitor_candidates)
        if self.retention.keeps_everything or self.save_top_k == 0 or self.dirpath is None:
            return
        resumed_from = [trainer.ckpt_path] if trainer.ckpt_path else []
        for path in self.retention.to_remove(step_checkpoints(Path(self.dirpath)), trainer.global_step, resumed_from):
            trainer.strategy.remove_checkpoint(path)
            if trainer.is_global_zero:
                log.info("removed %s (callbacks.checkpoint: keep_last=%s, keep_every_n_steps=%s)", path,
                         self.retention.keep_last, self.retention.keep_every_n_steps)
