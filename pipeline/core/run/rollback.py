"""A resume from an earlier step than the run's later checkpoints (a rollback, e.g. past a loss spike): refused unless
asked, because from that step on the run saves over them (step*.ckpt of the same steps, last.ckpt at its first save).
Asked (resume.rollback=true), the later checkpoints are first moved aside, whole, into a folder of their own.

Aside, not left in place: ckpt_path=auto (every start of infra/slurm/train.sbatch, every restart of a failed try by
pipeline/core/cluster/restarts.py, the workflow's stages) resumes from the run's highest step, so the first course's
step 6 left beside the new course's step 2 would be the next requeue's resume: the rollback undone without a word. The
folder, checkpoints/rolled_back_from_step<N>_to_step<M>_<time>/, is one that no search for checkpoints looks into (they
read checkpoints/*.ckpt only: checkpoint_files.run_checkpoints, the retention's step_checkpoints, the removal of partial
saves); its rollback.json says what was moved, from where, when, and to which step the run went back. To go forward
again, resume from one of them: ckpt_path=<that folder>/step<N>.ckpt.

A rollback is a resume from a lower step than a complete checkpoint of the run (checkpoint_files.run_checkpoints: files
or DeepSpeed directories; steps: checkpoint_steps.recorded_step). Its later checkpoints are all those of a higher step,
complete or not (each would be saved over). A resume from the newest complete checkpoint (ckpt_path=auto or last) is
none, also where a save of a higher step was cut short: that one is passed over and saved over, as at any resume
(checkpoint_files.py). A checkpoint whose step cannot be read (cut short, not named step<N>.ckpt) is not counted.

Ranks: every rank decides from the files, after every other check and before any collective (pipeline/pretraining/
run.py), so that a refusal stops every rank alike and none waits on another. Rank 0 alone moves, once training starts
(pipeline/core/run/rollback_callback.py): that is after every rank has joined the process group, so after every rank has
decided, and none sees the folder half moved. A kill during the move leaves some later checkpoints in place and the
others aside, every one whole; a second rollback moves the rest.

Under SLURM, train.sbatch resumes from the run's newest complete checkpoint at every start, whatever ckpt_path was
submitted: move the later checkpoints aside first (pipeline/core/cluster/move_aside.py, which holds the run
directory while it moves), then submit the job with the run's RUN_DIR.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.core.checkpoints.checkpoint_files import (
    CHECKPOINT_DIR,
    UnreadableCheckpoint,
    is_complete,
    run_checkpoints,
)
from pipeline.core.checkpoints.checkpoint_steps import recorded_step
from pipeline.core.devices import is_first_process

ROLLBACK_KEY = "resume.rollback"
ASIDE_PREFIX = "rolled_back_from_step"
NOTE_NAME = "rollback.json"
log = logging.getLogger(__name__)


class RollbackRefused(FileExistsError):
    """A resume from an earlier step than checkpoints of the run, without resume.rollback=true."""


@dataclasses.dataclass(frozen=True)
class Rollback:
    """A resume of the run in `output_dir` from `checkpoint` (of `step`), where `later` ({path: step}) are above it."""
    output_dir: Path
    checkpoint: Path
    step: int
    later: dict[Path, int]

    @property
    def highest(self) -> int:
        return max(self.later.values())

    def listed(self) -> str:
        by_step = sorted(self.later.items(), key=lambda item: (item[1], item[0].name == "last.ckpt", item[0].name))
        return ", ".join(f"{path.name} (step {step})" for path, step in by_step)   # last.ckpt after step<N>.ckpt

    def move_aside(self) -> Path:
        """Moves the later checkpoints into a new folder under checkpoints/ (rank 0 only); returns it."""
        checkpoint_dir = self.output_dir / CHECKPOINT_DIR
        time = datetime.datetime.now().astimezone()
        base = checkpoint_dir / f"{ASIDE_PREFIX}{self.highest}_to_step{self.step}_{time:%Y%m%dT%H%M%S}"
        aside, k = base, 0
        while aside.exists():   # two rollbacks within one second
            k += 1
            aside = base.with_name(f"{base.name}.{k}")
        aside.mkdir(parents=True)
        note = {"resumed_from": str(self.checkpoint), "step": self.step, "time": time.isoformat(timespec="seconds"),
                "moved": {str(path): step for path, step in sorted(self.later.items())}}
        (aside / NOTE_NAME).write_text(json.dumps(note, indent=1) + "\n", encoding="utf-8")
        for path in sorted(self.later, key=self.later.get):   # lowest first: a kill leaves the highest in place
            shutil.move(path, aside / path.name)               # a rename on one filesystem: nothing is copied
        return aside


def find_rollback(output_dir: Path, ckpt_path: str | Path | None) -> Rollback | None:
    """The rollback that resuming the run in output_dir from ckpt_path is, or None: not a resume, a checkpoint that
    says no step, or no complete checkpoint of the run above its step."""
    if ckpt_path is None:
        return None
    checkpoint = Path(ckpt_path)
    step = _step(checkpoint)
    if step is None:
        return None
    output_dir = Path(output_dir)
    later = {}
    for candidate in run_checkpoints(output_dir / CHECKPOINT_DIR, output_dir):
        candidate_step = _step(candidate)
        if candidate_step is not None and candidate_step > step:
            later[candidate] = candidate_step
    return Rollback(output_dir, checkpoint, step, later) if any(map(is_complete, later)) else None


def _step(checkpoint: Path) -> int | None:
    try:
        return recorded_step(checkpoint)
    except PermissionError as error:   # which checkpoints are later cannot be told
        raise UnreadableCheckpoint(Path(error.filename or checkpoint)) from None


def check_rollback(output_dir: Path, ckpt_path: str | None, resume: Mapping[str, Any] | None) -> Rollback | None:
    """The rollback a resume from ckpt_path is, allowed by resume.rollback (resume: the config's `resume` group), or
    None where it is none. Raises RollbackRefused where it is one that was not asked for."""
    asked = (resume or {}).get("rollback", False)
    if not isinstance(asked, bool):
        raise ValueError(f"{ROLLBACK_KEY}={asked!r}: give true or false")
    rollback = find_rollback(output_dir, ckpt_path)
    if rollback is None:
        return None
    if not asked:
        raise RollbackRefused(
            f"ckpt_path={ckpt_path} is of step {rollback.step}, and the run in {output_dir} holds checkpoints of "
            f"later steps, which resuming from it would overwrite: {rollback.listed()}. To go back to step "
            f"{rollback.step} on purpose, add {ROLLBACK_KEY}=true: they are moved, whole, to "
            f"{output_dir / CHECKPOINT_DIR}/{ASIDE_PREFIX}{rollback.highest}_to_step{rollback.step}_<time>/ and the "
            "run resumes. Or resume into another output_dir; or resume the newest with ckpt_path=auto")
    if is_first_process():
        log.warning("rolling back to step %d (%s=true): %s go to %s/%s%d_to_step%d_<time>/ once training starts",
                    rollback.step, ROLLBACK_KEY, rollback.listed(), output_dir / CHECKPOINT_DIR, ASIDE_PREFIX,
                    rollback.highest, rollback.step)
    return rollback
