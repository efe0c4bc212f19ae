"""A SLURM requeue continues the same W&B run: the real pre-training (pipeline/train.py, W&B offline) as a job on the
real local SLURM, signalled with USR1 mid-run as at its time limit; Lightning checkpoints and requeues it, and the
restarted job resumes from that checkpoint into the W&B run the first one started, so the phase is one curve."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def logged_steps(run_dir: Path) -> list[int]:
    metrics = run_dir / "csv" / "metrics.csv"
    if not metrics.is_file():
        return []
    with metrics.open(newline="") as handle:
        return [int(float(row["step"])) for row in csv.DictReader(handle) if row.get("train/loss")]


@pytest.mark.slow
def test_a_requeued_run_continues_its_wandb_run(slurm_cluster, small_shards, tmp_path, read_wandb_history):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    overrides = " ".join([f"data.path={small_shards}", f"hydra.run.dir={run_dir}", "data.global_batch_size=8",
                          "data.micro_batch_size=4", "data.num_workers=0", "trainer.max_steps=40",
                          "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", "scheduler.warmup_steps=2",
                          "callbacks.checkpoint.every_n_train_steps=1000", "logger=wandb_offline", "export.hf=false"])
    job = tmp_path / "train.sbatch"
    # The requeue contract of infra/slurm/train.sbatch, on one CPU task.
    job.write_text(f"""#!/bin/bash
#SBATCH --job-name=bert-wandb-requeue
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --time=00:15:00
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output={tmp_path}/slurm-%j.out
set -euo pipefail
export OMP_NUM_THREADS=1 PYTHONPATH={REPO_ROOT} WANDB_CONFIG_DIR={tmp_path}/wandb_config
srun {sys.executable} pipeline/train.py {overrides}
""")
    submitted = slurm_cluster.run("sbatch", "--parsable", f"--chdir={REPO_ROOT}", str(job), check=True)
    job_id = submitted.stdout.strip().split(";")[0]

    def job_output() -> str:
        log = next(tmp_path.glob("slurm-*.out"), None)
        return (log.read_text(errors="replace")[-6000:] if log else "(no job output)") + "\n" + slurm_cluster.logs()

    try:
        slurm_cluster._wait(lambda: len(logged_steps(run_dir)) >= 5, 240, "training did not start")
        slurm_cluster.run("scancel", "--signal=USR1", job_id, check=True)
        slurm_cluster._wait(lambda: slurm_cluster.job_field(job_id, "Restarts") == "1"
                            and slurm_cluster.job_field(job_id, "JobState") == "PENDING", 120, "job was not requeued")
        slurm_cluster.run("scontrol", "update", f"JobId={job_id}", "StartTime=now", check=True)
        state = slurm_cluster.wait_for_job(job_id, timeout_s=900)
    except (TimeoutError, RuntimeError) as error:
        slurm_cluster.run("scancel", job_id)
        raise AssertionError(f"{error}\n{job_output()}") from None
    assert state == "COMPLETED", f"job {job_id} ended {state}\n{job_output()}"
    assert any(run_dir.glob("hpc_ckpt_*.ckpt")), "no requeue checkpoint: the job was not interrupted"

    run_id = (run_dir / "wandb" / "run_id").read_text().strip()
    incarnations = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(incarnations) == 2, incarnations                        # one per start of the job ...
    assert {path.name.rsplit("-", 1)[1] for path in incarnations} == {run_id}   # ... both the same W&B run
    steps = [row["trainer/global_step"] for path in incarnations for log in path.glob("run-*.wandb")
             for row in read_wandb_history(log) if "train/loss" in row]
    assert max(steps) == 39 and set(range(40)) <= set(steps)         # one curve, every step, up to the end
