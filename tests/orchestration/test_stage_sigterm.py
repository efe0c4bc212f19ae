"""A pre-training stage whose training is stopped by SIGTERM is not finished: the stage runner fails it and writes no
sentinel (DONE.json), so that no export or fine-tuning runs on its unfinished checkpoint. The tiny workflow's
pretrain_phase1 (30 steps), run by the stage runner itself (what its rule runs, here locally) on a real shard set
standing in for prep_phase1's output; its training process sends itself a real SIGTERM at step 4, through a
`sitecustomize` module of the test's own on PYTHONPATH (imported at the start of the stage's training process), as
tests/orchestration/test_stage_restarts.py kills it."""
from __future__ import annotations

import shutil

import pytest

from pipeline.core.app import REPO_ROOT
from pipeline.orchestration import runs
from pipeline.orchestration.launch import write_launch
from pipeline.orchestration.stage_config import stage_specs
from pipeline.orchestration.stage_runner import StageError, run_stage
from pipeline.orchestration.workflow_config import Stage, load_workflow

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
    root = tmp_path / "wf"
    workflow = load_workflow(["+workflow=tiny", f"workflow.root={root}", PHASE1])
    launch = runs.read_json(write_launch(workflow, stage_specs(workflow, check_shapes=False), REPO_ROOT))
    # prep_phase1 as finished: its run directory holding a real phase-1 shard set
    prep = Stage.from_dict(launch["stages"]["prep_phase1"])
    prep_dir = root / "prep_phase1" / runs.version_name(prep.identity, {})
    shutil.copytree(small_shards, prep_dir)
    runs.write_json(prep_dir / runs.RECORD, {"identity": prep.identity, "finished": runs.now(), "content": "shards"})
    runs.point_current(root / "prep_phase1", prep_dir)
    runs.write_json(runs.sentinel_path(root, "prep_phase1"), {"content": "shards"})

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("WANDB_MODE", "disabled")
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
