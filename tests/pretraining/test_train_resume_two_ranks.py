"""Exact resume on every rank: 2 CPU processes (DDP over gloo) train N steps straight; the same run killed with
SIGKILL on both ranks mid-epoch after the checkpoint of step N/2, then resumed from it, gives both ranks' losses
of every micro-batch after the checkpoint bit for bit. Dropout is seeded per rank."""
from __future__ import annotations

import json
import signal

import pytest
import torch

from pipeline.pretraining.module import RNG_KEY
from tests.helpers.training import run_two_rank_training

N, CHECKPOINT_EVERY = 8, 4


def overrides(shards, output_dir, *extra):
    # Dropout on (the tiny preset's 0.1); per rank 2 micro-batches of ONE sequence a step, so that each batch is
    # padded to its own row's length and the two ranks draw different amounts of dropout randomness.
    return [f"data.path={shards}", f"output_dir={output_dir}", "trainer.devices=2", "strategy=ddp",
            "data.global_batch_size=4", "data.micro_batch_size=1", "data.num_workers=1", f"trainer.max_steps={N}",
            "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
            "scheduler.warmup_steps=2", f"callbacks.checkpoint.every_n_train_steps={CHECKPOINT_EVERY}",
            "export.hf=false", "export.plot=false", *extra]


def records(out, rank):
    lines = [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]
    starts = [r for r in lines if "rng" in r]
    batches = {(r["step"], r["batch"]): r for r in lines if "loss" in r}   # a batch seen twice: the later one wins
    return starts, batches


@pytest.mark.slow
def test_both_ranks_resume_bitwise_after_sigkill(wiki_shards, tmp_path):
    straight_out, resumed_out = tmp_path / "straight_records", tmp_path / "resumed_records"
    straight = run_two_rank_training(tmp_path, straight_out, overrides(wiki_shards, tmp_path / "straight"))
    assert straight.returncode == 0, straight.stderr[-6000:]

    killed = run_two_rank_training(tmp_path, resumed_out, overrides(wiki_shards, tmp_path / "resumed"),
                                   kill_at_step=CHECKPOINT_EVERY + 1)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-6000:]
    checkpoint = tmp_path / "resumed" / "checkpoints" / f"step{CHECKPOINT_EVERY:07d}.ckpt"
    assert checkpoint.is_file() and not (tmp_path / "resumed" / "checkpoints" / f"step{N:07d}.ckpt").exists()
    _, killed_batches = records(resumed_out, 1)
    assert max(step for step, _ in killed_batches) == CHECKPOINT_EVERY   # one step past the checkpoint, then lost

    # Each rank's own states are in the checkpoint, and they differ.
    states = torch.load(checkpoint, map_location="cpu", weights_only=True)[RNG_KEY]
    assert sorted(states) == [0, 1] and not torch.equal(states[0]["torch"], states[1]["torch"])

    resumed = run_two_rank_training(tmp_path, resumed_out, overrides(wiki_shards, tmp_path / "resumed",
                                                                     f"ckpt_path={checkpoint}"))
    assert resumed.returncode == 0, resumed.stderr[-6000:]

    widths = {}
    for rank in (0, 1):
        (start,), expected = records(straight_out, rank)
        starts, got = records(resumed_out, rank)
        assert [s["start_step"] for s in starts] == [0, CHECKPOINT_EVERY]
        after = sorted(key for key in expected if key[0] >= CHECKPOINT_EVERY)
        assert len(after) == 2 * (N - CHECKPOINT_EVERY)
        for key in after:
            assert got[key]["loss"] == expected[key]["loss"], f"rank {rank}, (step, batch) {key}"
        widths[rank] = [expected[key]["width"] for key in sorted(expected)]
        widths[f"rng{rank}"] = start["rng"]
    # The case this test is about: the ranks' batches had different widths (different amounts of dropout), and
    # their dropout streams were seeded apart.
    assert widths[0] != widths[1]
    assert widths["rng0"] != widths["rng1"]
