"""callbacks.checkpoint.keep_last / keep_every_n_steps: a run keeps the newest N periodic checkpoints and every K-th
(by step), never last.ckpt, the newest or the one it resumed from; a resume from what is kept continues. In real
runs: one process here; 2 processes under DeepSpeed (directories written by every rank) in
tests/core/test_checkpoint_retention_two_ranks.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from pipeline.core.app import compose
from pipeline.core.checkpoints.checkpoint_retention import Retention, step_checkpoints
from pipeline.pretraining.checks import preflight
from pipeline.pretraining.run import train

KEEP = ("callbacks.checkpoint.every_n_train_steps=1", "callbacks.checkpoint.keep_last=2",
        "callbacks.checkpoint.keep_every_n_steps=4", "export.hf=false", "export.plot=false")


def names(checkpoint_dir: Path) -> set[str]:
    return {p.name for p in checkpoint_dir.glob("*.ckpt")}


def expected(*steps: int) -> set[str]:
    return {f"step{step:07d}.ckpt" for step in steps} | {"last.ckpt"}


class Interrupted(Exception):
    pass


class InterruptAt(pl.Callback):
    """Ends the fit once `step` optimizer steps are done (and saved), as a node failure would."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step >= self.step:
            raise Interrupted(trainer.global_step)


def test_a_run_keeps_the_newest_and_every_kth_and_its_resume_continues(small_shards, tmp_path, tiny_overrides):
    out = tmp_path / "run"
    overrides = tiny_overrides(small_shards, out, 14, *KEEP, "ckpt_path=auto")     # saves at every step
    with pytest.raises(Interrupted):
        train(compose("train", overrides), extra_callbacks=[InterruptAt(12)])
    assert names(out / "checkpoints") == expected(4, 8, 11, 12)

    resumed = train(compose("train", overrides))
    assert resumed["global_step"] == 14
    assert names(out / "checkpoints") == expected(4, 8, 12, 13, 14)     # 11 goes too: the policy reads the folder
    last = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 14


def test_what_is_never_removed():
    kept = Retention(keep_last=2, keep_every_n_steps=4)
    on_disk = {step: Path(f"/run/checkpoints/step{step:07d}.ckpt") for step in range(1, 13)}
    assert sorted(on_disk) == list(range(1, 13))
    removed = kept.to_remove(on_disk, 12)
    assert {p.name for p in removed} == {f"step{s:07d}.ckpt" for s in (1, 2, 3, 5, 6, 7, 9, 10)}
    # the checkpoint a fit resumed from stays while it runs
    assert on_disk[5] not in kept.to_remove(on_disk, 12, protected=[on_disk[5]])
    # resumed from step 5 (rolled back): the later checkpoints of the first course stay, the newest are 5 and 6
    assert kept.to_remove(on_disk, 6) == [on_disk[s] for s in (1, 2, 3)]
    assert Retention().to_remove(on_disk, 12) == []          # the default keeps everything, as before


def test_step_checkpoints_are_the_periodic_ones_only(tmp_path):
    for name in ("step0000004.ckpt", "step0000012.ckpt", "last.ckpt", "step0000008-v1.ckpt",
                 ".checkpoint-0123.partial"):
        (tmp_path / name).touch()
    (tmp_path / "step0000016.ckpt").mkdir()                  # a DeepSpeed checkpoint is a directory
    assert step_checkpoints(tmp_path) == {4: tmp_path / "step0000004.ckpt", 12: tmp_path / "step0000012.ckpt",
                                          16: tmp_path / "step0000016.ckpt"}


@pytest.mark.parametrize("overrides, message", [
    (["callbacks.checkpoint.keep_last=0"], "keep_last must be a positive integer or null, got 0"),
    (["callbacks.checkpoint.keep_every_n_steps=1000"], "keep_every_n_steps=1000 with keep_last=null"),
    (["callbacks.checkpoint.keep_last=2", "callbacks.checkpoint.keep_every_n_steps=250"],
     "keep_every_n_steps=250 is not a multiple of every_n_train_steps=100"),
])
def test_settings_that_do_not_fit_are_refused_before_the_run(overrides, message):
    with pytest.raises(ValueError, match=message):
        preflight(compose("train", overrides))
