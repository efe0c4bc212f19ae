"""`ckpt_path=last` resumes from the checkpoint of the run's highest step, not from the one modified last: users
`touch` old checkpoints to dodge scratch purges, and a `cp -r` of a run reorders mtimes too. `python
pipeline/train.py` as users run it: a finished tiny run of 6 steps (checkpoints of steps 2, 4, 6 and last.ckpt), its
step-2 checkpoint touched, then resumed. Resumed from step 2 it would train steps 3-6 again, rewrite step 4, step 6
and last.ckpt, and log those steps twice. The file-level cases: tests/core/test_checkpoint_steps.py."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from collections import Counter

import pytest

from pipeline.core.app import REPO_ROOT


def train(overrides: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT), "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, "pipeline/train.py", *overrides], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done


@pytest.mark.slow
def test_ckpt_path_last_resumes_from_the_highest_step_though_an_older_checkpoint_was_touched(
        small_shards, tmp_path, tiny_overrides):
    run_dir = tmp_path / "run"
    overrides = [o for o in tiny_overrides(small_shards, run_dir, 6) if not o.startswith("callbacks.checkpoint.every")]
    overrides += ["callbacks.checkpoint.every_n_train_steps=2", f"hydra.run.dir={run_dir}"]
    train(overrides)
    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("*.ckpt")) == [
        "last.ckpt", "step0000002.ckpt", "step0000004.ckpt", "step0000006.ckpt"]
    later = {name: (checkpoints / name).stat().st_mtime_ns for name in ("step0000004.ckpt", "step0000006.ckpt")}
    os.utime(checkpoints / "step0000002.ckpt")          # `touch`: now the newest by mtime

    resumed = train([*overrides, "ckpt_path=last"])
    output = resumed.stdout + resumed.stderr
    resumed_from = [line for line in output.splitlines() if "resuming from" in line]
    print("\n".join(resumed_from))
    assert any(f"resuming from {checkpoints}/last.ckpt" in line or f"resuming from {checkpoints}/step0000006.ckpt"
               in line for line in resumed_from), output[-4000:]
    assert "step0000002.ckpt, of step 2, was modified after it" in output
    # nothing of the run was trained again: its later checkpoints untouched, each step logged once
    assert {name: (checkpoints / name).stat().st_mtime_ns for name in later} == later
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        logged = Counter(row["step"] for row in csv.DictReader(handle) if row.get("train/loss"))
    assert logged and max(logged.values()) == 1, logged
