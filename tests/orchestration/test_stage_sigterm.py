"""A pre-training stage whose training is stopped by SIGTERM is not finished: the stage runner fails it and writes no
sentinel (DONE.json), so that no export or fine-tuning runs on its unfinished checkpoint. The tiny workflow's
pretrain_phase1 (30 steps), run by the stage runner itself (what its rule runs, here locally) on a real shard set
standing in for prep_phase1's output; its training process sends itself a real SIGTERM at step 4, through a
`sitecustomize` module of the test's own on PYTHONPATH (imported at the start of the stage's training process), as
tests/orchestration/test_stage_restarts.py kills it."""
from __future__ import annotations

import pytest

from pipeline.orchestration import runs
from pipeline.orchestration.stage_runner import StageError, run_stage
from tests.helpers.workflows import phase1_stage_on_shards

PHASE1 = ("workflow.stages.pretrain_phase1.overrides=['trainer.max_steps=30','scheduler.warmup_steps=2',"
          "'data.global_batch_size=4','data.micro_batch_size=4','data.num_workers=0',"
          "'callbacks.checkpoint.every_n_train_steps=3','trainer.enable_progress_bar=false',"
          "'trainer.enable_model_summary=false']")

SITECUSTOMIZE = """
import os, signal
import pytorch_lightning as pl
import pipeline.pretraining.run as run


class TerminateAtStep4(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 4 and not trainer.received_sigterm:
            os.kill(os.getpid(), signal.SIGTERM)


train = run.train
run.train = lambda cfg, extra_callbacks=(): train(cfg, extra_callbacks=[*extra_callbacks, TerminateAtStep4()])
"""


@pytest.mark.slow
def test_a_pretraining_stage_stopped_by_sigterm_is_not_finished(tmp_path, small_shards, monkeypatch):
    root, launch = phase1_stage_on_shards(tmp_path, small_shards, PHASE1, SITECUSTOMIZE, monkeypatch)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    try:
        run_stage(launch, "pretrain_phase1", str(tmp_path / "rule.log"))
        outcome = "run_stage returned: the stage counts as finished"
    except StageError as error:
        outcome = f"StageError: {error}"
    print(outcome)

    assert not runs.sentinel_path(root, "pretrain_phase1").exists(), outcome
    [run_dir] = [d for d in (root / "pretrain_phase1").iterdir() if d.is_dir() and d.name != runs.CURRENT]
    record = runs.read_json(run_dir / runs.RECORD)
    assert record["finished"] is None and "content" not in record
    assert [t["exit"] for t in record["attempts"][-1]["tries"]] == [143], record["attempts"]
    assert "failed with exit status 143" in outcome
    assert not (run_dir / "hf_export").exists()
