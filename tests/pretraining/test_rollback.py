"""A rollback, a resume from an earlier step than the run's later checkpoints (e.g. past a loss spike), never
overwrites them unasked: refused by default, naming each; with resume.rollback=true they are moved, byte for byte, to
a folder of their own under checkpoints/, which the choice of the newest checkpoint (ckpt_path=auto: every SLURM start)
and retention never look into, and the run resumes. The real train() on a tiny run of 6 steps with a checkpoint every
2 (step 2, 4, 6 and last.ckpt), resumed from step 2; DeepSpeed-shaped directories, moved by the command line that a
SLURM user runs before submitting, at the end. Under 2 ranks: tests/core/test_rollback_two_ranks.py."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import pytorch_lightning as pl

from pipeline.core.app import REPO_ROOT, compose
from pipeline.core.checkpoints.checkpoint_files import newest_complete_checkpoint
from pipeline.core.checkpoints.checkpoint_retention import step_checkpoints
from pipeline.pretraining.run import train

LATER = ("step0000004.ckpt", "step0000006.ckpt", "last.ckpt")


def settings(shards: Path, out: Path, tiny_overrides, *extra: str) -> list[str]:
    return tiny_overrides(shards, out, 6, "callbacks.checkpoint.every_n_train_steps=2", "export.hf=false",
                          "export.plot=false", *extra)


def contents(directory: Path) -> dict[str, str]:
    """sha256 of every file below `directory`, by relative path (a DeepSpeed checkpoint is a folder of files)."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


class Interrupted(Exception):
    pass


class StartAndStop(pl.Callback):
    """Notes the step training starts from; ends the fit once `stop_at` steps are done (and saved)."""

    def __init__(self, stop_at: int):
        self.stop_at, self.started_at = stop_at, None

    def on_train_start(self, trainer, pl_module):
        self.started_at = trainer.global_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step >= self.stop_at:
            raise Interrupted(trainer.global_step)


@pytest.fixture(scope="module")
def finished_run(small_shards, tmp_path_factory, tiny_overrides) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    train(compose("train", settings(small_shards, out, tiny_overrides)))
    assert sorted(p.name for p in (out / "checkpoints").glob("*.ckpt")) == sorted(["step0000002.ckpt", *LATER])
    return out


@pytest.fixture
def run_dir(finished_run, tmp_path) -> Path:
    return Path(shutil.copytree(finished_run, tmp_path / "run"))


def test_a_resume_from_an_earlier_step_is_refused_naming_the_later_checkpoints(run_dir, small_shards, tiny_overrides):
    checkpoints = run_dir / "checkpoints"
    before = contents(run_dir)
    try:
        train(compose("train", settings(small_shards, run_dir, tiny_overrides,
                                        f"ckpt_path={checkpoints / 'step0000002.ckpt'}")))
        refusal = "(trained: not refused)"
    except FileExistsError as error:
        refusal = str(error)
    print(refusal)
    after = contents(run_dir)
    assert {name for name in before if after.get(name) != before[name]} == set()     # nothing overwritten
    assert "step0000004.ckpt (step 4), step0000006.ckpt (step 6), last.ckpt (step 6)" in refusal
    assert "resume.rollback=true" in refusal and "is of step 2" in refusal


def test_an_asked_rollback_moves_the_later_checkpoints_aside_whole_and_resumes(run_dir, small_shards, tiny_overrides):
    checkpoints = run_dir / "checkpoints"
    first_course = {name: contents(checkpoints / name) if (checkpoints / name).is_dir() else
                    hashlib.sha256((checkpoints / name).read_bytes()).hexdigest() for name in LATER}
    steps = StartAndStop(stop_at=5)      # the new course saves step 4 (and last.ckpt), then ends
    with pytest.raises(Interrupted):
        train(compose("train", settings(small_shards, run_dir, tiny_overrides, "resume.rollback=true",
                                        f"ckpt_path={checkpoints / 'step0000002.ckpt'}")), extra_callbacks=[steps])
    assert steps.started_at == 2

    [aside] = [p for p in checkpoints.iterdir() if p.is_dir() and p.name.startswith("rolled_back_from_step6_to_step2")]
    assert {name: hashlib.sha256((aside / name).read_bytes()).hexdigest() for name in LATER} == first_course
    note = json.loads((aside / "rollback.json").read_text())
    assert note["step"] == 2 and sorted(Path(p).name for p in note["moved"]) == sorted(LATER)

    # The new course's checkpoints are the run's; the first course's are seen by nothing that picks one
    assert sorted(p.name for p in checkpoints.glob("*.ckpt")) == ["last.ckpt", "step0000002.ckpt", "step0000004.ckpt"]
    newest = newest_complete_checkpoint(checkpoints, run_dir)
    assert newest is not None and newest.parent == checkpoints and newest.name in ("last.ckpt", "step0000004.ckpt")
    assert sorted(step_checkpoints(checkpoints)) == [2, 4]
    found = subprocess.run([sys.executable, "-m", "pipeline.core.checkpoints.checkpoint_files", str(run_dir)],
                           cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert Path(found.stdout.strip()).parent == checkpoints


def deepspeed_directory(path: Path, step: int, tag_files: dict[str, bytes]) -> Path:
    """A complete DeepSpeed checkpoint as deepspeed_checkpoints.publish leaves one: a tag, its record, `latest`."""
    tag = path / f"global_step{step}"
    tag.mkdir(parents=True)
    for name, data in tag_files.items():
        (tag / name).write_bytes(data)
    record = {"global_step": step, "files": {name: len(data) for name, data in tag_files.items()}}
    (tag / "complete.json").write_text(json.dumps(record))
    (path / "latest").write_text(tag.name)
    return path


def test_the_command_line_moves_later_deepspeed_directories_aside(tmp_path):
    from pipeline.core.run.rollback import check_rollback

    run, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
    for name, step in (("step0000002.ckpt", 2), ("step0000004.ckpt", 4), ("last.ckpt", 4)):
        deepspeed_directory(checkpoints / name, step, {f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt": bytes([step, r])
                                                       for r in range(2)})
    (checkpoints / "step0000006.ckpt" / "global_step6").mkdir(parents=True)     # a save killed before its `latest`
    # From the newest complete checkpoint (what ckpt_path=auto takes), past a save cut short: no rollback
    assert check_rollback(run, str(checkpoints / "last.ckpt"), {"rollback": False}) is None
    later = ("step0000004.ckpt", "step0000006.ckpt", "last.ckpt")
    before = {name: contents(checkpoints / name) for name in later}
    with pytest.raises(FileExistsError, match=r"step0000004.ckpt \(step 4\), last.ckpt \(step 4\), "
                                              r"step0000006.ckpt \(step 6\)"):
        check_rollback(run, str(checkpoints / "step0000002.ckpt"), {"rollback": False})
    assert {name: contents(checkpoints / name) for name in later} == before

    moved = subprocess.run([sys.executable, "-m", "pipeline.core.cluster.move_aside", str(run),
                            str(checkpoints / "step0000002.ckpt")], cwd=REPO_ROOT, capture_output=True, text=True)
    assert moved.returncode == 0, moved.stderr
    aside = Path(moved.stdout.strip())
    assert aside.parent == checkpoints and aside.name.startswith("rolled_back_from_step6_to_step2_")
    assert {name: contents(aside / name) for name in later} == before and (aside / "step0000006.ckpt").is_dir()
    assert newest_complete_checkpoint(checkpoints, run) == checkpoints / "step0000002.ckpt"
    assert check_rollback(run, str(checkpoints / "step0000002.ckpt"), {"rollback": False}) is None
