"""Batch-size warm-up in real training on 2 CPU ranks (DDP over gloo), with 2 loader workers a rank: a run killed with
SIGKILL on both ranks inside the ramp, after a checkpoint, and resumed with ckpt_path=auto trains every later step
on the rows of the uninterrupted run, with its losses bit for bit and its final weights; and one rank trains each
step on the rows two ranks train on."""
from __future__ import annotations

import json
import signal
import sys

import pytest

from pipeline.pretraining.data.batch_warmup import BatchWarmup
from tests.helpers.ranks import local_launch_env, run_rank_group

N, CHECKPOINT_EVERY, KILL_AT = 8, 2, 3
# Global batch 4 for the first 5 steps (20 rows x 128 tokens), then 8: passes of 1, then 2 rows
WARMUP = BatchWarmup(tokens=20 * 128, start_batch_size=4, increment=4, full_batch_size=8, tokens_per_row=128)

# Each rank records, per micro-batch, its step, its loss's bits and a digest of each row's tokens (the batch carries
# no row index: equal tokens, equal rows), and at the end a digest of the weights; SIGKILL at the start of the first
# batch once KILL_AT optimizer steps are done.
SCRIPT = """
import hashlib, json, os, signal, sys
import torch
torch.set_num_threads(1)
import pytorch_lightning as pl
from pipeline.core.app import compose
from pipeline.pretraining.run import train

out, kill_at = sys.argv[1], int(sys.argv[2])


class Record(pl.Callback):
    def _write(self, trainer, record):
        with open(os.path.join(out, f"rank{trainer.global_rank}.jsonl"), "a") as handle:
            handle.write(json.dumps(record) + "\\n")

    def on_train_start(self, trainer, pl_module):
        self._write(trainer, {"start_step": trainer.global_step})

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if kill_at and trainer.global_step >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        self.step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        lengths = mask.sum(1).tolist() if mask is not None else [ids.shape[1]] * ids.shape[0]
        rows = [hashlib.sha1(ids[i, :n].numpy().tobytes()).hexdigest()[:12] for i, n in enumerate(lengths)]
        self._write(trainer, {"step": self.step, "batch": batch_idx, "loss": float(outputs["loss"]).hex(),
                              "rows": rows})

    def on_train_end(self, trainer, pl_module):
        digest = hashlib.sha256()
        for name, value in sorted(pl_module.state_dict().items()):
            digest.update(name.encode() + value.detach().cpu().numpy().tobytes())
        self._write(trainer, {"weights": digest.hexdigest()})


train(compose("train", sys.argv[3:]), extra_callbacks=[Record()])
"""


def overrides(shards, output_dir, devices=2):
    return [f"data.path={shards}", f"output_dir={output_dir}", f"trainer.devices={devices}", "strategy=ddp",
            "data.global_batch_size=8", "data.micro_batch_size=2", "data.num_workers=2", f"trainer.max_steps={N}",
            "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
            "scheduler.warmup_steps=2", f"callbacks.checkpoint.every_n_train_steps={CHECKPOINT_EVERY}",
            "export.hf=false", "export.plot=false", "data.verify_checksums=false",
            f"data.batch_warmup.tokens={WARMUP.tokens}",
            f"data.batch_warmup.start_batch_size={WARMUP.start_batch_size}",
            f"data.batch_warmup.batch_size_increment={WARMUP.increment}", "ckpt_path=auto"]


def run(tmp_path, out, args, kill_at=0):
    script = tmp_path / "batch_warmup_training.py"
    script.write_text(SCRIPT)
    out.mkdir(parents=True, exist_ok=True)
    return run_rank_group([sys.executable, str(script), str(out), str(kill_at), *args], local_launch_env(), 300)


def records(out, rank):
    lines = [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]
    batches = {(r["step"], r["batch"]): r for r in lines if "loss" in r}   # a batch seen twice: the later one wins
    return batches, [r["weights"] for r in lines if "weights" in r], [r["start_step"] for r in lines
                                                                      if "start_step" in r]


def rows_of_steps(out, ranks):
    """{step: every rank's rows of it, in micro-batch order q = rank x accumulation + j}"""
    steps = {}
    for rank in range(ranks):
        batches, _, _ = records(out, rank)
        for (step, _), record in sorted(batches.items()):
            steps.setdefault(step, {}).setdefault(rank, []).extend(record["rows"])
    return {step: [row for rank in sorted(by_rank) for row in by_rank[rank]] for step, by_rank in steps.items()}


@pytest.fixture(scope="module")
def straight(wiki_shards, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("warmup_straight")
    result = run(tmp, tmp / "records", overrides(wiki_shards, tmp / "run"))
    assert result.returncode == 0, result.stderr[-6000:]
    return tmp / "records"


@pytest.mark.slow
def test_a_resume_inside_the_ramp_continues_bitwise(straight, wiki_shards, tmp_path):
    assert WARMUP.batch_size(KILL_AT) == 4 and WARMUP.ramp_steps == 5     # killed, and resumed, inside the ramp
    out, run_dir = tmp_path / "records", tmp_path / "run"
    killed = run(tmp_path, out, overrides(wiki_shards, run_dir), kill_at=KILL_AT)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-6000:]
    assert max(step for step, _ in records(out, 1)[0]) == KILL_AT - 1       # trained past the checkpoint, then lost
    assert (run_dir / "checkpoints" / f"step{CHECKPOINT_EVERY:07d}.ckpt").is_file()
    resumed = run(tmp_path, out, overrides(wiki_shards, run_dir))        # ckpt_path=auto: from step 2
    assert resumed.returncode == 0, resumed.stderr[-6000:]

    expected_rows, got_rows = rows_of_steps(straight, 2), rows_of_steps(out, 2)
    assert [len(expected_rows[s]) for s in range(N)] == [WARMUP.batch_size(s) for s in range(N)]
    assert {s: got_rows[s] for s in range(N)} == expected_rows
    for rank in (0, 1):
        expected, expected_weights, _ = records(straight, rank)
        got, got_weights, starts = records(out, rank)
        assert starts == [0, CHECKPOINT_EVERY]       # the resume started from the checkpoint, not from scratch
        assert sorted(got) == sorted(expected)
        for key in sorted(expected):
            if key[0] >= CHECKPOINT_EVERY:
                assert got[key]["loss"] == expected[key]["loss"], f"rank {rank}, (step, batch) {key}"
        assert got_weights[-1] == expected_weights[-1]


@pytest.mark.slow
def test_one_rank_trains_each_step_on_the_rows_of_two(straight, wiki_shards, tmp_path):
    result = run(tmp_path, tmp_path / "records", overrides(wiki_shards, tmp_path / "run", devices=1))
    assert result.returncode == 0, result.stderr[-6000:]
    assert rows_of_steps(tmp_path / "records", 1) == rows_of_steps(straight, 2)
