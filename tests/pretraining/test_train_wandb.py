"""`python pipeline/train.py` as users run it, with W&B offline: everything a run leaves, the metrics read back
from W&B's transaction log, and the API key in no file and no output."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.app import REPO_ROOT

SENTINEL = "wandb-key-sentinel-7f3a9c2e5b1d4086"


@pytest.mark.slow
def test_command_line_run_with_wandb_offline(small_shards, tmp_path, read_wandb_history):
    pytest.importorskip("wandb")
    homes = {name: tmp_path / name for name in ("wandb_config", "home", "tmp")}
    for path in homes.values():
        path.mkdir()
    run_dir = tmp_path / "run"
    # No PYTHONPATH: the program runs from the installed (editable) checkout, as a user runs it. W&B's own directories
    # (config, cache, data) are left to train() (inside the run) except its config dir, which is the user's.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(homes["home"]), "TMPDIR": str(homes["tmp"]),
           "OMP_NUM_THREADS": "2", "WANDB_API_KEY": SENTINEL, "WANDB_CONFIG_DIR": str(homes["wandb_config"])}
    command = [sys.executable, "pipeline/train.py", "+debug=dryrun", f"data.path={small_shards}",
               f"hydra.run.dir={run_dir}", "trainer.enable_progress_bar=false", "logger=wandb_offline",
               "logger.name=offline-test"]
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "step 4:" in done.stdout

    for path in ("checkpoints/last.ckpt", "checkpoints/step0000002.ckpt", "checkpoints/step0000004.ckpt",
                 "csv/metrics.csv", "curves.png", "hf_export/model.safetensors", "hf_export/vocab.txt",
                 ".hydra/config.yaml", ".hydra/overrides.yaml"):
        assert (run_dir / path).is_file(), path

    runs = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, sorted(str(p) for p in (run_dir / "wandb").rglob("*"))
    logged = [row for row in read_wandb_history(runs[0]) if "train/loss" in row]
    assert [row["trainer/global_step"] for row in logged] == [0, 1, 2, 3]
    for row in logged:
        assert {"train/mlm_loss", "train/nsp_loss", "train/mlm_acc", "train/nsp_acc", "train/lr",
                "train/grad_norm", "perf/tokens_per_s", "perf/sequences_per_s"} <= set(row)
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        csv_losses = [float(row["train/loss"]) for row in csv.DictReader(handle) if row["train/loss"]]
    assert [row["train/loss"] for row in logged] == pytest.approx(csv_losses, rel=1e-6)

    searched = 0
    for root in (run_dir, *homes.values()):
        for path in Path(root).rglob("*"):
            if path.is_file() and not path.is_symlink():
                searched += 1
                assert SENTINEL.encode() not in path.read_bytes(), f"API key written to {path}"
    assert searched > 20
    assert SENTINEL not in done.stdout and SENTINEL not in done.stderr
