"""Which periodic checkpoints of a run are kept: the newest `keep_last` and every `keep_every_n_steps`-th, by step.

A BERT-Large phase-1 run saving every 200 steps keeps about 36 checkpoints of 4 GB when every one is kept
(`keep_last: null`, the default). With `keep_last: 2` and `keep_every_n_steps: 1000` it keeps the two newest and
those of steps 1000, 2000, ...; a checkpoint is removed right after a newer one has been saved
(ResumingModelCheckpoint, pipeline/core/checkpoints/lightning_checkpoints.py). Never removed:
- last.ckpt, temporary files of a save under way, and anything that is not a periodic `step<N>.ckpt`;
- the newest periodic checkpoint: the one just saved, complete (its save returned), is always among the newest;
- the checkpoint the fit resumed from, while it runs (as Lightning's own ModelCheckpoint);
- checkpoints of steps after the fit's current step (a save of a higher step cut short, which the resume passed
  over). A rollback's (a run resumed from an earlier checkpoint, past a loss spike) are not there: the run would save
  over them, so it is refused unless asked (resume.rollback=true), and then they are moved into a folder below
  checkpoints/ before its first save (pipeline/core/run/rollback.py);
- anything in a folder below checkpoints/ (only `step<N>.ckpt` directly in it is periodic).

The default keeps every checkpoint, as before: a default that removes would, at the first requeue after an update,
delete checkpoints of runs that were started with the promise that all are kept.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

STEP_FILENAME = "step{step:07d}"                        # ModelCheckpoint's filename template: step0000400.ckpt
_STEP_CHECKPOINT = re.compile(r"^step(\d+)\.ckpt$")     # a file (DDP) or a DeepSpeed directory


@dataclasses.dataclass(frozen=True)
class Retention:
    keep_last: int | None = None              # None: keep every periodic checkpoint
    keep_every_n_steps: int | None = None     # also keep those whose step is a multiple of this

    @classmethod
    def from_config(cls, checkpoint_cfg: Mapping[str, Any]) -> Retention:
        """From callbacks.checkpoint (keep_last, keep_every_n_steps, every_n_train_steps); raises ValueError naming
        the key that does not fit."""
        keep_last, keep_every = checkpoint_cfg.get("keep_last"), checkpoint_cfg.get("keep_every_n_steps")
        every = int(checkpoint_cfg.get("every_n_train_steps") or 0)
        for key, value in (("keep_last", keep_last), ("keep_every_n_steps", keep_every)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"callbacks.checkpoint.{key} must be a positive integer or null, got {value!r}")
        if keep_every is not None and keep_last is None:
            raise ValueError(f"callbacks.checkpoint.keep_every_n_steps={keep_every} with keep_last=null, which keeps "
                             "every checkpoint: set keep_last (the newest N to keep beside every K-th), or "
                             "keep_every_n_steps=null")
        if keep_every is not None and every and keep_every % every:
            raise ValueError(f"callbacks.checkpoint.keep_every_n_steps={keep_every} is not a multiple of "
                             f"every_n_train_steps={every}, the steps checkpoints are saved at: use a multiple, "
                             f"e.g. {(keep_every // every + 1) * every}")
        return cls(keep_last, keep_every)

    @property
    def keeps_everything(self) -> bool:
        return self.keep_last is None

    def to_remove(self, checkpoints: Mapping[int, Path], current_step: int, protected: Iterable[Path] = ()
                  ) -> list[Path]:
        """The checkpoints ({step: path}) that this policy lets go once the one of `current_step` is saved."""
        if self.keeps_everything:
            return []
        protected = {Path(p).absolute() for p in protected}
        steps = sorted(step for step in checkpoints if step <= current_step)
        newest = set(steps[-self.keep_last:])
        every = self.keep_every_n_steps
        return [checkpoints[step] for step in steps
                if step not in newest and not (every and step % every == 0)
                and Path(checkpoints[step]).absolute() not in protected]


def step_checkpoints(directory: Path) -> dict[int, Path]:
    """The periodic checkpoints in `directory`, by step."""
    found = {}
    for path in Path(directory).glob("step*.ckpt"):
        step = step_of_name(path.name)
        if step is not None:
            found[step] = path
    return found


def step_of_name(name: str) -> int | None:
    """N of a periodic checkpoint's name, step<N>.ckpt; None for any other name."""
    match = _STEP_CHECKPOINT.match(name)
    return int(match.group(1)) if match else None
