"""A DeepSpeed checkpoint's completion record holds each file's size as the rank that wrote it measured it, not as
rank 0 sees it: on NFS, rank 0's view of a file another node wrote comes from its attribute cache, stale for up to a
minute (acregmax), and a record of stale sizes makes the resume pass over the checkpoint as cut short.

One host has one view of its files; so rank 0 of a real 2-rank ZeRO-2 run on the CPU is given a stale one: its
`os.stat` reports rank 1's shards with 0 bytes, the size its cache held when it saw them created. The test process,
whose view is the file system's, then checks the checkpoint as a resume would."""
from __future__ import annotations

import json
import sys

import pytest

from pipeline.core.checkpoints.checkpoint_files import COMPLETION_RECORD, LATEST, checkpoint_problem
from tests.helpers.ranks import local_launch_env, run_rank_group

SCRIPT = """
import os, sys
import torch
torch.set_num_threads(1)
from pipeline.core.app import compose
from pipeline.pretraining.run import train

if int(os.environ.get("LOCAL_RANK", "0")) == 0:
    real_stat = os.stat

    def stat_as_a_stale_cache_has_it(path, *args, **kwargs):
        result = real_stat(path, *args, **kwargs)
        if isinstance(path, int) or "zero_pp_rank_1_" not in os.path.basename(os.fspath(path)):
            return result
        extra = {name: getattr(result, name) for name in dir(result) if name.startswith("st_") and name not in
                 ("st_mode", "st_ino", "st_dev", "st_nlink", "st_uid", "st_gid", "st_size")}
        return os.stat_result((*result[:6], 0, *result[7:10]), extra)

    os.stat = stat_as_a_stale_cache_has_it

train(compose("train", sys.argv[1:]))
"""


@pytest.mark.slow
def test_the_completion_record_holds_the_sizes_each_rank_wrote(tmp_path, small_shards, torch_extensions_dir):
    script = tmp_path / "deepspeed_training.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "run"
    overrides = [f"data.path={small_shards}", f"output_dir={run_dir}", "trainer.devices=2",
                 "strategy=deepspeed_stage_2", "data.global_batch_size=4", "data.micro_batch_size=2",
                 "data.num_workers=0", "trainer.max_steps=2", "trainer.enable_progress_bar=false",
                 "trainer.enable_model_summary=false", "scheduler.warmup_steps=1",
                 "callbacks.checkpoint.every_n_train_steps=2", "callbacks.checkpoint.save_last=false",
                 "export.hf=false", "export.plot=false", "data.verify_checksums=false"]
    env = local_launch_env(DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=torch_extensions_dir)
    done = run_rank_group([sys.executable, str(script), *overrides], env, timeout_s=600)
    assert done.returncode == 0, done.stderr[-6000:]

    checkpoint = run_dir / "checkpoints" / "step0000002.ckpt"
    assert checkpoint_problem(checkpoint) is None        # what the resume asks
    tag_dir = checkpoint / (checkpoint / LATEST).read_text().strip()
    recorded = json.loads((tag_dir / COMPLETION_RECORD).read_text())["files"]
    on_disk = {str(p.relative_to(tag_dir)): p.stat().st_size for p in tag_dir.rglob("*")
               if p.is_file() and p.name != COMPLETION_RECORD}
    assert recorded == on_disk and any("zero_pp_rank_1_" in name for name in recorded)
