"""Where a pre-training run starts: the checkpoint it resumes from (ckpt_path: a file, `last` or `auto`; or, for a
run without checkpoints of its own, resume.continue_from), or none (a start from step 0, never over a run's
checkpoints or record: fresh_start.py)."""
from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.core.checkpoints.checkpoint_files import newest_complete_checkpoint, remove_partial_checkpoints
from pipeline.core.checkpoints.weights import CHECKPOINT_DIR
from pipeline.core.devices import is_first_process
from pipeline.core.run.fresh_start import check_start_over

log = logging.getLogger("pipeline.pretraining")


def optional_path(cfg: Mapping[str, Any], key: str) -> str | None:
    value = cfg.get(key)
    return None if value in (None, "") else str(value)


def _newest_checkpoint(output_dir: Path, required: bool = True) -> str | None:
    """ckpt_path=last: the newest complete checkpoint of the run in output_dir (a write killed half-way leaves
    only a temporary file, removed here, and the previous checkpoint whole). ckpt_path=auto (required=False): the
    same, or None when the run has none yet; refused where it has checkpoints, none complete (fresh_start.py)."""
    if is_first_process():
        for partial in remove_partial_checkpoints(output_dir / CHECKPOINT_DIR, output_dir):
            log.info("removed %s, left by an interrupted checkpoint write", partial)
    newest = newest_complete_checkpoint(output_dir / CHECKPOINT_DIR, output_dir)
    if newest is None and not required:
        check_start_over(output_dir, "ckpt_path=auto")   # a run with checkpoints, none usable: refused, not redone
        return None
    if newest is None:
        raise FileNotFoundError(f"ckpt_path=last: no complete checkpoint in {output_dir / CHECKPOINT_DIR} (pass the "
                                "run's output_dir=..., or start without ckpt_path)")
    log.info("resuming from %s, the newest complete checkpoint", newest)
    return str(newest)


def checkpoint_to_resume(cfg: Mapping[str, Any], output_dir: Path) -> str | None:
    """ckpt_path, resolved: last and auto as _newest_checkpoint says; then, where the run has no checkpoint of its
    own yet, resume.continue_from (another run's checkpoint: the decay phase of warmup-stable-decay, in a directory
    of its own, from a stable phase's checkpoint). A plain start never lands over a run's checkpoints or record."""
    ckpt_path = optional_path(cfg, "ckpt_path")
    continue_from = optional_path(cfg.get("resume") or {}, "continue_from")
    if ckpt_path not in (None, "last", "auto") and continue_from is not None:
        raise ValueError(f"ckpt_path={ckpt_path} and resume.continue_from={continue_from}: give one (continue_from "
                         "is where a run without checkpoints of its own starts; ckpt_path=auto resumes its own after)")
    lightning_requeue = any(output_dir.glob("hpc_ckpt_*.ckpt"))   # which Lightning resumes from unasked
    if ckpt_path in ("last", "auto"):   # auto: resume if the run has a checkpoint, else start (the workflow)
        ckpt_path = _newest_checkpoint(output_dir, required=ckpt_path == "last")
    elif ckpt_path is None and not lightning_requeue:
        check_start_over(output_dir, "ckpt_path=null")
    if ckpt_path is None and continue_from is not None and not lightning_requeue:
        log.info("continuing from %s (resume.continue_from): %s holds no checkpoint of this run yet", continue_from,
                 output_dir)
        return continue_from
    return ckpt_path
