"""A start from step 0 into a run directory that holds a run already: refused where it would overwrite what the run
made, naming it, and saying how to start over on purpose.

A run starts from step 0 on ckpt_path=null, and on ckpt_path=auto where its directory holds no complete checkpoint
(infra/slurm/train.sbatch and the workflow pass auto at every start, the first one included;
pipeline/core/cluster/restarts.py passes it to every restart of a failed try). From step 0 it saves its step*.ckpt and
last.ckpt over the run's, and replaces the run's record (run_config.json: its first start and every change it accepted)
with a first start of its own. So such a start goes ahead only where nothing of a run is lost. What stops it:
- a checkpoint of the run (checkpoint_files.run_checkpoints), complete or not, each named with what is wrong with it
  (checkpoint_files.checkpoint_problem). Under auto none is complete, else the run would resume from it; one that is
  not complete was whole once (a save replaces a file whole, and switches a DeepSpeed directory to a new save only
  once every rank's files are written): it was cut short or damaged since, by a copy, a disk, a quota or an older
  version, and may be restored from where it came, with its hours of training.
- a record that says the run went on from a checkpoint (a change accepted at a resume, or a record begun at one): its
  checkpoints are gone (moved, or purged from scratch), and the record is what is left of the run.
What does not: a DeepSpeed directory without `latest` (none of its saves ever finished: the run was stopped inside
its first save there, and a new save goes beside what that left: deepspeed_checkpoints.new_tag), and a record of a run
that never saved a checkpoint. That run was stopped or preempted before its first save: starting it again loses
nothing, and each SLURM start after such a preemption does so.
"""
from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.checkpoints.checkpoint_files import CHECKPOINT_DIR, LATEST, checkpoint_problem, run_checkpoints
from pipeline.core.checkpoints.checkpoint_steps import recorded_step
from pipeline.core.run.run_record import RECORD_NAME


class StartOverRefused(FileExistsError):
    """A start from step 0 into a run directory whose run it would overwrite."""


def check_start_over(output_dir: Path, asked_by: str) -> None:
    """Raises StartOverRefused where a start from step 0 would overwrite the run in output_dir (asked_by: the setting
    that starts it, ckpt_path=null or ckpt_path=auto, for the message)."""
    output_dir = Path(output_dir)
    checkpoint_dir = output_dir / CHECKPOINT_DIR
    checkpoints = [path for path in run_checkpoints(checkpoint_dir, output_dir) if not _never_saved(path)]
    resumed_at = _record_resumed_at(output_dir / RECORD_NAME)
    if not checkpoints and resumed_at is None:
        return
    problems = {path: checkpoint_problem(path) for path in checkpoints}
    found = [f"{path}{_step_shown(path)}: {problem or 'complete'}" for path, problem in problems.items()]
    if resumed_at is not None:
        found.append(f"{output_dir / RECORD_NAME}, which says the run went on from a checkpoint of step {resumed_at}")
    if asked_by == "ckpt_path=auto":
        what = f"{asked_by} found no complete checkpoint to resume from in {checkpoint_dir}"
        remedy = "To resume, put a complete copy of a checkpoint back there"
    else:
        what = f"{asked_by} starts the run from step 0"
        remedy = ("To resume, pass ckpt_path=auto (its newest complete checkpoint)" if None in problems.values() else
                  "To resume, put a complete copy of a checkpoint back there")
    raise StartOverRefused(
        f"{what}, and {output_dir} holds a run that a start from step 0 would overwrite: {'; '.join(found)}. "
        f"{remedy}; to start over on purpose, use another output_dir, or move {checkpoint_dir} and "
        f"{output_dir / RECORD_NAME} aside first")


def _never_saved(checkpoint: Path) -> bool:
    """A DeepSpeed directory none of whose saves finished."""
    return checkpoint.is_dir() and not (checkpoint / LATEST).exists()


def _step_shown(checkpoint: Path) -> str:
    try:
        step = recorded_step(checkpoint)
    except PermissionError:
        return ""   # checkpoint_problem names it
    return "" if step is None else f" (step {step})"


def _record_resumed_at(record_path: Path) -> int | None:
    """The highest step the run's record says it went on from a checkpoint at; None where it says none. A record
    that cannot be read says none here (a resume refuses it, naming it: run_record.py)."""
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        entries = [*record.get("accepted_changes", []), record.get("first_start", {})]
        steps = [entry.get("step") or 0 for entry in entries]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    # a first start at step 0 is the only entry of a run that never resumed; an accepted change is made at a resume
    return max(steps) if len(entries) > 1 or steps[-1] else None
