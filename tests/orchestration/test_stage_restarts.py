"""The workflow's pre-training stage restarts a failed try as train.sbatch does (pipeline/core/cluster/restarts.py): the
tiny workflow's pretrain_phase1, run by the stage runner itself (what its rule runs, here locally), on a real shard set
standing in for prep_phase1's output, with its training process killed (SIGKILL) once after its first checkpoint.

The kill comes from a `sitecustomize` module of the test's own on PYTHONPATH, which Python imports at the start of
the stage's training process: it adds a callback to the real pipeline/pretraining/run.py's fit."""
from __future__ import annotations

import pytest

from pipeline.orchestration import runs
from pipeline.orchestration.stage_runner import LOG_NAME, run_stage
from tests.helpers.workflows import phase1_stage_on_shards

PHASE1 = ("workflow.stages.pretrain_phase1.overrides=['trainer.max_steps=6','scheduler.warmup_steps=2',"
          "'data.global_batch_size=4','data.micro_batch_size=4','data.num_workers=0',"
          "'callbacks.checkpoint.every_n_train_steps=3','trainer.enable_progress_bar=false',"
          "'trainer.enable_model_summary=false']")

SITECUSTOMIZE = """
import os, signal
import pytorch_lightning as pl
import pipeline.pretraining.run as run


class KillOnce(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        marker = os.environ["KILLED_MARKER"]
        if trainer.global_step == 4 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


train = run.train
run.train = lambda cfg, extra_callbacks=(): train(cfg, extra_callbacks=[*extra_callbacks, KillOnce()])
"""


@pytest.mark.slow
def test_a_pretraining_stage_killed_after_a_checkpoint_runs_again_from_it(tmp_path, small_shards, monkeypatch):
    root, launch = phase1_stage_on_shards(tmp_path, small_shards, PHASE1, SITECUSTOMIZE, monkeypatch)
    monkeypatch.setenv("KILLED_MARKER", str(tmp_path / "killed"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run_stage(launch, "pretrain_phase1", str(tmp_path / "rule.log"))      # raises StageError when the stage fails

    run_dir = (root / "pretrain_phase1" / runs.CURRENT).resolve()
    record = runs.read_json(run_dir / runs.RECORD)
    tries = record["attempts"][-1]["tries"]
    assert (tmp_path / "killed").exists() and record["finished"]
    assert [t["exit"] for t in tries] == [-9, 0], tries
    assert tries[0]["resumed_from"] is None and tries[1]["resumed_from"] == tries[0]["newest_checkpoint"]
    log = (run_dir / LOG_NAME).read_text()
    assert f"try 1 failed (killed by SIGKILL) after writing {tries[0]['newest_checkpoint']}: starting try 2" in log
