"""A kill -9 inside a checkpoint's write leaves the previous checkpoint loadable, and ckpt_path=last resumes
from the newest complete one."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.core.checkpoints.checkpoint_files import (
    PARTIAL_PREFIX,
    is_complete,
    newest_complete_checkpoint,
    remove_partial_checkpoints,
)
from pipeline.core.checkpoints.lightning_checkpoints import AtomicCheckpointIO

REPO_ROOT = Path(__file__).resolve().parents[2]

# The training process, with torch.save replaced so that its KILL_ON_SAVE-th call writes half of the checkpoint's
# bytes to wherever the real call would write them, then takes SIGKILL: a kill timed inside the write.
KILLED_IN_WRITE = """
import io, os, signal, sys
sys.path.insert(0, {repo!r})
import torch
torch.set_num_threads(2)
kill_on, calls, real_save = int(os.environ["KILL_ON_SAVE"]), [0], torch.save

def save_then_die_half_way(obj, f, *args, **kwargs):
    calls[0] += 1
    if calls[0] != kill_on:
        return real_save(obj, f, *args, **kwargs)
    buffer = io.BytesIO()
    real_save(obj, buffer, *args, **kwargs)
    out = open(f, "wb") if isinstance(f, (str, os.PathLike)) else f
    out.write(buffer.getvalue()[: buffer.tell() // 2])
    out.flush()
    os.kill(os.getpid(), signal.SIGKILL)

torch.save = save_then_die_half_way
from pipeline.core.app import compose
from pipeline.pretraining.run import train
train(compose("train", sys.argv[1:]))
"""


def killed_in_write(overrides: list[str], kill_on_save: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "KILL_ON_SAVE": str(kill_on_save), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-c", KILLED_IN_WRITE.format(repo=str(REPO_ROOT)), *overrides],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_kill_inside_a_checkpoint_write_keeps_the_previous_and_last_resumes(small_shards, tmp_path, tiny_overrides,
                                                                            training_process):
    out = tmp_path / "run"
    # Checkpoints every 5 steps; saves: step5, last (step 5), step10 <- killed half-way through this one.
    args = tiny_overrides(small_shards, out, 10, "export.hf=false")
    killed = killed_in_write(args, kill_on_save=3)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    checkpoints = out / "checkpoints"
    assert not (checkpoints / "step0000010.ckpt").exists()     # never under its real name while incomplete
    last = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 5
    assert list(checkpoints.glob(f"{PARTIAL_PREFIX}*"))        # what the killed write left

    resumed = training_process([*args, "ckpt_path=last"])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "FINAL_STEP 10" in resumed.stdout
    assert not list(checkpoints.glob(f"{PARTIAL_PREFIX}*"))
    assert torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 10


def test_an_interrupted_write_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    target = tmp_path / "checkpoints" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"global_step": 1, "w": torch.ones(1000)}, target)

    def interrupted(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt
    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"global_step": 2}, target)
    monkeypatch.undo()
    assert torch.load(target, weights_only=True)["global_step"] == 1
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]


def test_newest_complete_checkpoint_skips_a_truncated_one(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    AtomicCheckpointIO().save_checkpoint({"global_step": 5}, checkpoints / "step0000005.ckpt")
    whole = (checkpoints / "step0000005.ckpt").read_bytes()
    (checkpoints / "step0000010.ckpt").write_bytes(whole[: len(whole) // 2])   # e.g. copied by hand, cut short
    (checkpoints / f"{PARTIAL_PREFIX}x.partial").write_bytes(b"PK")
    assert not is_complete(checkpoints / "step0000010.ckpt")
    assert newest_complete_checkpoint(checkpoints, tmp_path) == checkpoints / "step0000005.ckpt"
    assert [p.name for p in remove_partial_checkpoints(checkpoints)] == [f"{PARTIAL_PREFIX}x.partial"]
    assert newest_complete_checkpoint(tmp_path / "none", tmp_path) is None
