"""Exact resume: N steps straight == N/2 steps, SIGKILL, resume from the N/2 checkpoint to N (bitwise, on CPU)."""
from __future__ import annotations

import csv
import signal

import pytest
import torch

N, CHECKPOINT_EVERY = 12, 6


def overrides(shards, output_dir, *extra):
    # Dropout on (the tiny preset's 0.1), 2 micro-batches of 4 per step, one loader worker process.
    return [f"data.path={shards}", f"output_dir={output_dir}", "data.global_batch_size=8", "data.micro_batch_size=4",
            "data.num_workers=1", f"trainer.max_steps={N}", "trainer.log_every_n_steps=1",
            "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "scheduler.warmup_steps=3",
            f"callbacks.checkpoint.every_n_train_steps={CHECKPOINT_EVERY}", "export.hf=false", *extra]


def logged(csv_path, column="train/loss"):
    values = {}
    with open(csv_path, newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get(column):
                values[int(row["step"])] = float(row[column])   # a step logged twice: the later row wins
    return values


@pytest.mark.slow
def test_resume_after_sigkill_matches_the_uninterrupted_run(small_shards, tmp_path, training_process):
    straight_dir, resumed_dir = tmp_path / "straight", tmp_path / "resumed"
    straight = training_process(overrides(small_shards, straight_dir))
    assert straight.returncode == 0, straight.stderr[-4000:]

    # Killed hard one step after the step-6 checkpoint was written: step 7 is trained, then lost.
    killed = training_process(overrides(small_shards, resumed_dir), kill_at_step=CHECKPOINT_EVERY + 1)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    checkpoint = resumed_dir / "checkpoints" / f"step{CHECKPOINT_EVERY:07d}.ckpt"
    assert checkpoint.is_file()
    assert not (resumed_dir / "checkpoints" / f"step{N:07d}.ckpt").exists()

    saved = checkpoint.read_bytes()
    resumed = training_process(overrides(small_shards, resumed_dir, f"ckpt_path={checkpoint}"))
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    # Not saved again at the resumed step's first micro-batch (Lightning's ModelCheckpoint would, with accumulation:
    # a state in the middle of a step, over the checkpoint it resumed from)
    assert checkpoint.read_bytes() == saved

    a = torch.load(straight_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    b = torch.load(resumed_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert a["global_step"] == b["global_step"] == N
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for name, tensor in a["state_dict"].items():
        assert torch.equal(tensor, b["state_dict"][name]), f"{name} differs after the resume"
    for state_a, state_b in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        for key, value in state_a.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(state_b[key])), key
    assert a["PretrainingDataModule"] == b["PretrainingDataModule"]

    # The losses logged after the resume point are the uninterrupted run's, to the bit.
    straight_losses, resumed_losses = logged(straight_dir / "csv" / "metrics.csv"), \
        logged(resumed_dir / "csv" / "metrics.csv")
    assert sorted(resumed_losses) == list(range(N))
    for step in range(N):
        assert resumed_losses[step] == straight_losses[step], step
