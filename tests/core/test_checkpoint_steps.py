"""The newest checkpoint of a run is the one of its highest step (pipeline/core/checkpoints/checkpoint_steps.py),
whatever the files' mtimes say, and a disagreement is reported: on real torch files and DeepSpeed-shaped directories.
The same on a real training run resumed with ckpt_path=last: tests/pretraining/test_resume_highest_step.py."""
from __future__ import annotations

import json
import logging
import os
import zipfile
from pathlib import Path

import torch

from pipeline.core.checkpoints.checkpoint_files import newest_complete_checkpoint


def lightning_file(path: Path, step: int) -> Path:
    """A torch file shaped as Lightning saves one: tensors, an OrderedDict, numpy's RNG state, the step."""
    import collections

    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"epoch": 0, "global_step": step, "pytorch-lightning_version": "2.6.6",
                "state_dict": collections.OrderedDict(w=torch.full((3,), float(step))),
                "loops": {"fit_loop": {"epoch_progress": {"current": {"ready": 1}}}},
                "numpy_rng": np.random.get_state(), "hyper_parameters": {"max_steps": 10}}, path)
    return path


def set_mtime(path: Path, seconds: float) -> None:
    os.utime(path, (seconds, seconds))


def test_a_step_is_read_from_the_name_else_from_the_checkpoint_itself(tmp_path):
    from pipeline.core.checkpoints.checkpoint_steps import recorded_step

    assert recorded_step(lightning_file(tmp_path / "step0000004.ckpt", 4)) == 4
    assert recorded_step(lightning_file(tmp_path / "last.ckpt", 7)) == 7
    assert recorded_step(lightning_file(tmp_path / "hpc_ckpt_2.ckpt", 9)) == 9   # Lightning's count, not a step
    (tmp_path / "cut.ckpt").write_bytes(b"PK\x03\x04 cut short")
    assert recorded_step(tmp_path / "cut.ckpt") is None


def test_a_deepspeed_directory_says_its_step_by_its_record_or_its_client_state(tmp_path):
    from pipeline.core.checkpoints.checkpoint_steps import recorded_step

    recorded = tmp_path / "last.ckpt"
    (recorded / "global_step12").mkdir(parents=True)
    (recorded / "latest").write_text("global_step12")
    (recorded / "global_step12" / "complete.json").write_text(json.dumps({"global_step": 12, "files": {}}))
    assert recorded_step(recorded) == 12

    older = tmp_path / "older.ckpt"   # written before completion records, under Lightning's fixed tag
    (older / "checkpoint").mkdir(parents=True)
    (older / "latest").write_text("checkpoint")
    lightning_file(older / "checkpoint" / "mp_rank_00_model_states.pt", 5)
    assert recorded_step(older) == 5


def test_the_newest_is_the_highest_step_though_an_older_one_was_touched(tmp_path, caplog):
    checkpoints = tmp_path / "checkpoints"
    for step, seconds in ((2, 1_000), (4, 2_000), (6, 3_000)):
        set_mtime(lightning_file(checkpoints / f"step{step:07d}.ckpt", step), seconds)
    set_mtime(lightning_file(checkpoints / "last.ckpt", 6), 3_001)
    set_mtime(checkpoints / "step0000002.ckpt", 4_000)      # `touch`, to dodge a scratch purge
    with caplog.at_level(logging.WARNING, logger="pipeline.core.checkpoints.checkpoint_files"):
        newest = newest_complete_checkpoint(checkpoints, tmp_path)
    assert newest == checkpoints / "last.ckpt"
    assert "step0000002.ckpt, of step 2, was modified after it" in caplog.text, caplog.text

    set_mtime(checkpoints / "last.ckpt", 500)               # of one step, the one completed last: as before
    assert newest_complete_checkpoint(checkpoints, tmp_path) == checkpoints / "step0000006.ckpt"


def test_a_higher_step_that_is_not_complete_is_passed_over(tmp_path, caplog):
    checkpoints = tmp_path / "checkpoints"
    lightning_file(checkpoints / "step0000002.ckpt", 2)
    with zipfile.ZipFile(checkpoints / "step0000004.ckpt", "w") as archive:
        archive.writestr("x/data.pkl", b"")
    (checkpoints / "step0000004.ckpt").write_bytes((checkpoints / "step0000004.ckpt").read_bytes()[:20])
    with caplog.at_level(logging.WARNING, logger="pipeline.core.checkpoints.checkpoint_files"):
        assert newest_complete_checkpoint(checkpoints, tmp_path) == checkpoints / "step0000002.ckpt"
    assert "not resuming from" in caplog.text and "step0000004.ckpt" in caplog.text
