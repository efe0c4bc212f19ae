"""A rollback under 2 CPU processes (DDP over gloo): a run of 6 steps with a checkpoint every 2, resumed from its step-2
checkpoint with resume.rollback=true, starts at step 2 on both ranks and finishes; its first course's later checkpoints
(steps 4, 6 and last.ckpt) are moved once, by rank 0, into one folder, byte for byte, and the new course's are the
run's. Every rank decides before it joins the process group, so none sees the folder half moved (rollback.py)."""
from __future__ import annotations

import hashlib
import json

import pytest

from pipeline.core.checkpoints.checkpoint_files import newest_complete_checkpoint
from tests.helpers.training import run_two_rank_training

LATER = ("step0000004.ckpt", "step0000006.ckpt", "last.ckpt")


def overrides(shards, output_dir, *extra):
    return [f"data.path={shards}", f"output_dir={output_dir}", "trainer.devices=2", "strategy=ddp",
            "data.global_batch_size=4", "data.micro_batch_size=2", "data.num_workers=0", "trainer.max_steps=6",
            "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
            "scheduler.warmup_steps=2", "callbacks.checkpoint.every_n_train_steps=2", "export.hf=false",
            "export.plot=false", *extra]


def start_steps(out, rank):
    lines = [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]
    return [r["start_step"] for r in lines if "start_step" in r]


@pytest.mark.slow
def test_both_ranks_roll_back_and_rank_0_alone_moves_the_later_checkpoints(small_shards, tmp_path):
    run, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
    first = run_two_rank_training(tmp_path, tmp_path / "first", overrides(small_shards, run))
    assert first.returncode == 0, first.stderr[-6000:]
    first_course = {name: hashlib.sha256((checkpoints / name).read_bytes()).hexdigest() for name in LATER}

    rolled = run_two_rank_training(tmp_path, tmp_path / "rolled", overrides(
        small_shards, run, f"ckpt_path={checkpoints / 'step0000002.ckpt'}", "resume.rollback=true"))
    assert rolled.returncode == 0, rolled.stderr[-6000:]
    assert start_steps(tmp_path / "rolled", 0) == start_steps(tmp_path / "rolled", 1) == [2]

    [aside] = [p for p in checkpoints.iterdir() if p.is_dir()]          # one folder: moved once
    assert aside.name.startswith("rolled_back_from_step6_to_step2_")
    assert {name: hashlib.sha256((aside / name).read_bytes()).hexdigest() for name in LATER} == first_course
    assert sorted(p.name for p in checkpoints.glob("*.ckpt")) == sorted(["step0000002.ckpt", *LATER])
    assert newest_complete_checkpoint(checkpoints, run).parent == checkpoints
