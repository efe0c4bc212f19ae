"""A start from step 0 never overwrites a run unasked (pipeline/core/run/fresh_start.py): ckpt_path=auto (every start of
train.sbatch and of the workflow's stages) into a run whose checkpoints are all cut short, or whose record says it
resumed while its checkpoints are gone, and ckpt_path=null into a run's directory, refuse, naming what they would
overwrite and how to start over on purpose; a run stopped before its first checkpoint still starts again under auto
(a preemption in the first save interval). Real runs: a tiny run of 4 steps with a checkpoint every 2 (step 2, 4 and
last.ckpt), `python pipeline/train.py` as train.sbatch runs it where the exit status is what matters."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import pytorch_lightning as pl

from pipeline.core.app import REPO_ROOT, compose
from pipeline.pretraining.run import train

CHECKPOINTS = ("last.ckpt", "step0000002.ckpt", "step0000004.ckpt")


def settings(shards: Path, out: Path, tiny_overrides, *extra: str) -> list[str]:
    return tiny_overrides(shards, out, 4, "callbacks.checkpoint.every_n_train_steps=2", "export.hf=false",
                          "export.plot=false", *extra)


def what_the_run_made(run: Path) -> dict[str, str]:
    """sha256 of its checkpoints, its record and its metrics log, by relative path."""
    files = [*(run / "checkpoints").rglob("*"), run / "run_config.json", *(run / "csv").rglob("*")]
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(files) if p.is_file()}


def changed(before: dict[str, str], run: Path) -> set[str]:
    after = what_the_run_made(run)
    return {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}


def refusal_of(overrides: list[str]) -> str:
    """The refusal of train(), or a note that it trained."""
    try:
        result = train(compose("train", overrides))
    except FileExistsError as error:
        return str(error)
    return f"(not refused: trained to step {result['global_step']})"


@pytest.fixture(scope="module")
def finished_run(finished_tiny_run) -> Path:
    """settings(...)'s run: the session's (tests/conftest.py), read only."""
    out = finished_tiny_run
    assert sorted(p.name for p in (out / "checkpoints").glob("*.ckpt")) == list(CHECKPOINTS)
    assert (out / "run_config.json").is_file()
    return out


@pytest.fixture
def run_dir(finished_run, tmp_path) -> Path:
    return Path(shutil.copytree(finished_run, tmp_path / "run"))


@pytest.mark.slow
def test_auto_refuses_to_start_over_a_run_whose_checkpoints_are_all_cut_short(run_dir, small_shards, tiny_overrides):
    """As a copy of the run to another cluster that was cut short leaves it: every checkpoint truncated."""
    for name in CHECKPOINTS:
        path = run_dir / "checkpoints" / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = what_the_run_made(run_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT), "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, "pipeline/train.py", *settings(small_shards, run_dir, tiny_overrides),
                           "ckpt_path=auto", f"hydra.run.dir={run_dir}"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    print(f"exit status {done.returncode}\n{output[-3000:]}")
    assert changed(before, run_dir) == set()
    assert done.returncode != 0          # 2 where pipeline/train.py tells a refusal (app.refused), else 1
    [refusal] = [line for line in output.splitlines() if "a start from step 0 would overwrite" in line]
    for name in CHECKPOINTS:
        assert f"{run_dir / 'checkpoints' / name}" in refusal
    assert refusal.count("not a whole torch checkpoint") == len(CHECKPOINTS)
    assert "another output_dir" in refusal and "aside" in refusal


@pytest.mark.slow
def test_auto_refuses_where_the_record_says_the_run_resumed_and_its_checkpoints_are_gone(run_dir, small_shards,
                                                                                         tiny_overrides):
    """Extended to 6 steps (a change accepted at the resume from step 4), then its checkpoints purged from scratch."""
    extended = train(compose("train", settings(small_shards, run_dir, tiny_overrides, "trainer.max_steps=6",
                                               "ckpt_path=auto", "resume.accept_changes=[trainer.max_steps]")))
    assert extended["global_step"] == 6
    shutil.rmtree(run_dir / "checkpoints")
    before = what_the_run_made(run_dir)
    refusal = refusal_of(settings(small_shards, run_dir, tiny_overrides, "trainer.max_steps=6", "ckpt_path=auto"))
    print(refusal)
    assert changed(before, run_dir) == set()
    assert f"{run_dir / 'run_config.json'}, which says the run went on from a checkpoint of step 4" in refusal


@pytest.mark.slow
def test_a_plain_start_into_a_runs_directory_is_refused(run_dir, small_shards, tiny_overrides):
    before = what_the_run_made(run_dir)
    refusal = refusal_of(settings(small_shards, run_dir, tiny_overrides))
    print(refusal)
    assert changed(before, run_dir) == set()
    assert refusal.startswith("ckpt_path=null starts the run from step 0")
    for name, step in zip(CHECKPOINTS, (4, 2, 4)):
        assert f"{run_dir / 'checkpoints' / name} (step {step}): complete" in refusal
    assert "pass ckpt_path=auto" in refusal


class Preempted(Exception):
    pass


class PreemptAfterFirstStep(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step >= 1:
            raise Preempted


@pytest.mark.slow
def test_a_run_stopped_before_its_first_checkpoint_starts_again_under_auto(small_shards, tmp_path, tiny_overrides):
    """Its record is written, no checkpoint yet (preempted in the first save interval): nothing is lost by starting
    again, and every SLURM start after such a preemption does."""
    run = tmp_path / "run"
    with pytest.raises(Preempted):
        train(compose("train", settings(small_shards, run, tiny_overrides, "ckpt_path=auto")),
              extra_callbacks=[PreemptAfterFirstStep()])
    assert (run / "run_config.json").is_file() and not list((run / "checkpoints").glob("*.ckpt"))
    assert train(compose("train", settings(small_shards, run, tiny_overrides, "ckpt_path=auto")))["global_step"] == 4


def deepspeed_save(checkpoint: Path, step: int, shard: bytes, published: bool) -> None:
    """A DeepSpeed save as deepspeed_checkpoints.py writes it; unpublished: killed before its record and `latest`."""
    tag = checkpoint / f"global_step{step}"
    tag.mkdir(parents=True)
    (tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(shard)
    if published:
        record = {"global_step": step, "files": {"zero_pp_rank_0_mp_rank_00_optim_states.pt": 64}}
        (tag / "complete.json").write_text(json.dumps(record))
        (checkpoint / "latest").write_text(tag.name)


def test_deepspeed_directories_a_first_save_killed_does_not_count_a_shard_cut_short_does(tmp_path):
    from pipeline.core.run.fresh_start import StartOverRefused, check_start_over

    checkpoints = tmp_path / "checkpoints"
    deepspeed_save(checkpoints / "step0000002.ckpt", 2, b"x" * 10, published=False)
    check_start_over(tmp_path, "ckpt_path=auto")          # no save there ever finished: nothing to lose
    check_start_over(tmp_path, "ckpt_path=null")
    deepspeed_save(checkpoints / "last.ckpt", 2, b"x" * 10, published=True)   # recorded 64 bytes: cut short since
    with pytest.raises(StartOverRefused, match=r"last.ckpt \(step 2\): global_step2/zero_pp_rank_0_mp_rank_00_optim_"
                                               r"states.pt has 10 bytes, its completion record says 64"):
        check_start_over(tmp_path, "ckpt_path=auto")
