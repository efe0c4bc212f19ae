"""Warmup-stable-decay with StableAdamW, trained by the real train() on real shards (tiny BERT, 12 steps: warmup
0..1, stable 2..7, 1-sqrt decay 8..11): a run stopped inside the stable phase or inside the decay and resumed continues
the uninterrupted run exactly (the same rate at every step and the same losses, to the bit); and the decay run as its
own phase, from a checkpoint in the middle of a longer stable phase, is the uninterrupted run's tail."""
from __future__ import annotations

import csv

import pytest

from pipeline.core.app import compose
from pipeline.core.run.run_record import ResumeRefused
from pipeline.pretraining.run import train

N, DECAY = 12, 4
WSD = ("optimizer=stable_adamw", "scheduler=warmup_stable_decay", "scheduler.decay_fraction=null")


def run(shards, output_dir, tiny_overrides, max_steps, *extra):
    overrides = tiny_overrides(shards, output_dir, max_steps, *WSD, "trainer.log_every_n_steps=1", "export.hf=false",
                               "export.plot=false", "callbacks.checkpoint.every_n_train_steps=0", *extra)
    return train(compose("train", overrides))


def logged(output_dir, column: str) -> dict[int, float]:
    with open(output_dir / "csv" / "metrics.csv", newline="") as handle:
        return {int(row["step"]): float(row[column]) for row in csv.DictReader(handle) if row.get(column)}


@pytest.fixture(scope="module")
def uninterrupted(small_shards, tiny_overrides, tmp_path_factory):
    """The run straight through: {column: {step: value}}."""
    output_dir = tmp_path_factory.mktemp("uninterrupted")
    run(small_shards, output_dir, tiny_overrides, N, f"scheduler.decay_steps={DECAY}")
    straight = {column: logged(output_dir, column) for column in ("train/lr", "train/loss")}
    assert sorted(straight["train/loss"]) == list(range(N))
    lrs = straight["train/lr"]
    assert lrs[1] < lrs[2] == lrs[7] == lrs[8] > lrs[9] > lrs[10] > lrs[11] > 0     # warmup, stable, decay
    return straight


def assert_continues(output_dir, straight, steps):
    for column in ("train/lr", "train/loss"):
        values = logged(output_dir, column)
        assert {s: values[s] for s in steps} == {s: straight[column][s] for s in steps}, column


@pytest.mark.slow
@pytest.mark.parametrize("stopped_at", [5, 9], ids=["in the stable phase", "in the decay"])
def test_a_resume_inside_a_phase_continues_it_exactly(small_shards, tiny_overrides, tmp_path, uninterrupted,
                                                     stopped_at):
    """Stopped when its budget ended (trainer.max_steps; the schedule's length fixed by scheduler.total_steps), then
    extended to the end: the rates and losses from the stop on are the uninterrupted run's."""
    schedule = (f"scheduler.decay_steps={DECAY}", f"scheduler.total_steps={N}")
    run(small_shards, tmp_path, tiny_overrides, stopped_at, *schedule)
    result = run(small_shards, tmp_path, tiny_overrides, N, *schedule, "ckpt_path=auto",
                 "++resume.accept_changes=[trainer.max_steps]")
    assert result["global_step"] == N
    assert_continues(tmp_path, uninterrupted, range(N))


@pytest.mark.slow
def test_the_decay_as_its_own_phase_from_a_stable_checkpoint_is_the_uninterrupted_runs_tail(
        small_shards, tiny_overrides, tmp_path, uninterrupted):
    k = N - DECAY
    # The stable phase: no decay, 10 steps, a checkpoint every 4 (its step-8 one in the middle of the phase)
    run(small_shards, tmp_path, tiny_overrides, 10, "scheduler.decay_steps=0",
        "callbacks.checkpoint.every_n_train_steps=4")
    assert_continues(tmp_path, uninterrupted, range(k))          # the same run as the uninterrupted one up to k
    checkpoint = tmp_path / "checkpoints" / f"step{k:07d}.ckpt"
    decay_phase = (f"ckpt_path={checkpoint}", f"scheduler.decay_steps={DECAY}")
    with pytest.raises(ResumeRefused, match=r"scheduler.decay_steps: 0 -> 4.*trainer.max_steps: 10 -> 12"):
        run(small_shards, tmp_path, tiny_overrides, N, *decay_phase)     # the scheduler's keys shape the run
    # In a directory of its own, so that the stable run's later checkpoints (step 10 here) stay as they are: a user
    # decays from several of them (ModernBERT #252), each into its own run.
    stable_last = (tmp_path / "checkpoints" / "last.ckpt").read_bytes()
    decayed = tmp_path / f"decay_from_{k}"
    with pytest.raises(ResumeRefused, match=r"since its checkpoint was trained: scheduler.decay_steps: 0 -> 4.*"
                                            r"trainer.max_steps: 10 -> 12"):   # the checkpoint's own settings
        run(small_shards, decayed, tiny_overrides, N, *decay_phase)
    result = run(small_shards, decayed, tiny_overrides, N, *decay_phase,
                 f"++resume.accept_changes=[scheduler.decay_steps:{DECAY},trainer.max_steps:{N}]")
    assert result["global_step"] == N
    assert_continues(decayed, uninterrupted, range(k, N))
    assert (tmp_path / "checkpoints" / "last.ckpt").read_bytes() == stable_last


@pytest.mark.slow
def test_the_decay_continued_from_another_runs_checkpoint_resumes_its_own_after_a_requeue(
        small_shards, tiny_overrides, tmp_path, uninterrupted):
    """The workflow's decay stage: ckpt_path=auto with resume.continue_from=<the stable run's checkpoint>, the keys it
    changes accepted by name. Its first start continues the stable run's step-8 checkpoint (the uninterrupted run's
    tail); started again after losing its newest checkpoints (a requeue after a crash), it resumes its own step-9
    one, not the stable run's again, and the steps it trains again are the same."""
    k = N - DECAY
    stable = tmp_path / "stable"
    run(small_shards, stable, tiny_overrides, k, "scheduler.decay_steps=0")
    decayed = tmp_path / "decay"
    decay_phase = ("ckpt_path=auto", f"resume.continue_from={stable / 'checkpoints' / 'last.ckpt'}",
                   f"scheduler.decay_steps={DECAY}",
                   "++resume.accept_changes=[scheduler.decay_steps,trainer.max_steps]",
                   "callbacks.checkpoint.every_n_train_steps=1")
    assert run(small_shards, decayed, tiny_overrides, N, *decay_phase)["global_step"] == N
    assert_continues(decayed, uninterrupted, range(k, N))
    for name in ("last.ckpt", *(f"step{s:07d}.ckpt" for s in range(k + 2, N + 1))):
        (decayed / "checkpoints" / name).unlink()
    assert run(small_shards, decayed, tiny_overrides, N, *decay_phase)["global_step"] == N
    assert_continues(decayed, uninterrupted, range(k, N))
    with open(decayed / "csv" / "metrics.csv", newline="") as handle:
        trained = [int(row["step"]) for row in csv.DictReader(handle) if row.get("train/loss")]
    # Step k once (the first start), k + 1 onwards twice: the second start went on from its own step-(k + 1) state
    assert {s: trained.count(s) for s in range(k, N)} == {k: 1, **{s: 2 for s in range(k + 1, N)}}
