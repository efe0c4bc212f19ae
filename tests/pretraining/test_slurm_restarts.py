"""infra/slurm/train.sbatch on the real local SLURM when a try fails, and when W&B hangs at a requeue:

- a rank killed (SIGKILL, as a GPU error or the OOM killer ends one) after the run's first checkpoint: the try is
  started again within the job, from that checkpoint, and the run finishes;
- a rank killed at the same step before any checkpoint, every time: the job stops after that one try, saying it is a
  crash loop (a second try would fail the same way);
- W&B's service stopped (it answers nothing, as a W&B server that hangs) when the requeue signal comes: the ranks
  save, W&B is given up after REQUEUE_WANDB_TIMEOUT_S, and the job is requeued all the same.

The failures come from a callback of the test's own, added to the real pipeline/train.py by a wrapper (as in
test_slurm_requeue.py): nothing in the shipped code knows of them.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS, CHECKPOINT_EVERY = 6, 3

# pipeline/train.py as train.sbatch runs it, with the test's callbacks: each start's first step to
# RECORDS/starts-rank<R>; the last rank killed at CRASH_AT_STEP (with CRASH_ONCE only the first time); the first start
# held at PARK_AT_STEP (RECORDS/parked-rank<R> holding its pid) until the requeue signal has come.
WRAPPER = """
import os, runpy, signal, time
import pytorch_lightning as pl
import pipeline.pretraining.run as run
from pipeline.core.cluster.requeue import RequeueOnSignal

out = os.environ["RECORDS"]
crash_at, park_at = int(os.environ.get("CRASH_AT_STEP", "-1")), int(os.environ.get("PARK_AT_STEP", "-1"))


class Starts(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        with open(os.path.join(out, f"starts-rank{trainer.global_rank}"), "a") as handle:
            handle.write(f"{trainer.global_step}\\n")


class Crash(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        marker = os.path.join(out, "crashed")
        if trainer.global_step == crash_at and trainer.global_rank == trainer.world_size - 1 and not (
                os.environ.get("CRASH_ONCE") and os.path.exists(marker)):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


class Park(pl.Callback):
    done = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.done or trainer.global_step != park_at or os.environ.get("SLURM_RESTART_COUNT", "0") != "0":
            return
        self.done = True
        with open(os.path.join(out, f"parked-rank{trainer.global_rank}"), "w") as handle:
            handle.write(str(os.getpid()))
        request = next(c for c in trainer.callbacks if isinstance(c, RequeueOnSignal)).request
        deadline = time.monotonic() + 300
        while not request.received and time.monotonic() < deadline:
            time.sleep(0.05)


train = run.train
run.train = lambda cfg, extra_callbacks=(): train(cfg, extra_callbacks=[*extra_callbacks, Starts(), Crash(), Park()])
runpy.run_path(os.path.join(os.environ["REPO_ROOT"], "pipeline", "train.py"), run_name="__main__")
"""


def job_script(tmp: Path) -> Path:
    """infra/slurm/train.sbatch as it is, but for the GPUs this node has not, and pipeline/train.py run through the
    wrapper above."""
    text = (REPO_ROOT / "infra" / "slurm" / "train.sbatch").read_text()
    wrapper = tmp / "train_with_failures.py"
    wrapper.write_text(WRAPPER)
    srun = "srun --kill-on-bad-exit=1 python pipeline/train.py "
    assert "#SBATCH --gpus-per-node=8\n" in text and srun in text
    script = tmp / "train.sbatch"
    script.write_text(text.replace("#SBATCH --gpus-per-node=8\n", "").replace(
        srun, f"srun --kill-on-bad-exit=1 {sys.executable} {wrapper} "))
    return script


def submit(cluster, tmp: Path, shards: Path, ranks: int, env: dict[str, str], *extra: str) -> str:
    (tmp / "records").mkdir(parents=True)
    overrides = [f"data.path={shards}", "strategy=ddp", f"data.global_batch_size={2 * ranks}",
                 "data.micro_batch_size=2", "data.num_workers=1", f"trainer.max_steps={STEPS}",
                 "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false",
                 "trainer.enable_model_summary=false", "scheduler.warmup_steps=2", "scheduler.warmup_fraction=null",
                 f"callbacks.checkpoint.every_n_train_steps={CHECKPOINT_EVERY}", "export.hf=false",
                 "export.plot=false", *extra]
    job_env = {**cluster.env, "RUN_DIR": str(tmp / "run"), "EXPERIMENT": "cpu_hour", "RECORDS": str(tmp / "records"),
               "REPO_ROOT": str(REPO_ROOT), "PYTHONPATH": str(REPO_ROOT), "WANDB_CONFIG_DIR": str(tmp / "wandb_config"),
               **env}
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", f"--ntasks-per-node={ranks}", "--cpus-per-task=1", "--time=00:20:00",
         "--job-name=bert-restarts", f"--output={tmp}/slurm-%j.out", str(job_script(tmp)), *overrides],
        cwd=REPO_ROOT, env=job_env, capture_output=True, text=True, check=True)
    return submitted.stdout.strip().split(";")[0]


def job_log(tmp: Path) -> str:
    log = next(tmp.glob("slurm-*.out"), None)
    return log.read_text(errors="replace") if log else "(no job output)"


def starts(tmp: Path, rank: int) -> list[int]:
    path = tmp / "records" / f"starts-rank{rank}"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


@pytest.fixture(scope="module")
def failed_jobs(slurm_cluster, tmp_path_factory, small_shards):
    """Two jobs of 2 ranks at once: rank 1 killed at step 4 (after the checkpoint of step 3) once; and at step 1
    (before any checkpoint) every time."""
    once, always = tmp_path_factory.mktemp("crash_once"), tmp_path_factory.mktemp("crash_loop")
    jobs = {"once": (once, submit(slurm_cluster, once, small_shards, 2, {"CRASH_AT_STEP": "4", "CRASH_ONCE": "1"})),
            "loop": (always, submit(slurm_cluster, always, small_shards, 2, {"CRASH_AT_STEP": "1"}))}
    return {name: (tmp, job, slurm_cluster.wait_for_job(job, timeout_s=600)) for name, (tmp, job) in jobs.items()}


@pytest.mark.slow
def test_a_try_that_failed_after_a_new_checkpoint_starts_again_from_it_and_the_run_finishes(failed_jobs,
                                                                                           slurm_cluster):
    tmp, job, state = failed_jobs["once"]
    log = job_log(tmp)
    assert state == "COMPLETED", f"{log[-8000:]}\n{slurm_cluster.logs()}"
    assert re.search(rf"try 1 failed \([^)]*\) after writing {tmp / 'run' / 'checkpoints'}/\S+\.ckpt: starting try 2 "
                     r"from it \(restart 1 of at most 3, MAX_RESTARTS\)", log), log[-8000:]
    assert (tmp / "records" / "crashed").exists()
    for rank in (0, 1):
        assert starts(tmp, rank) == [0, CHECKPOINT_EVERY], (rank, log[-8000:])    # try 2 resumed from step 3
    assert slurm_cluster.job_field(job, "Restarts") in ("0", "")      # within the job: SLURM never requeued it
    assert f"run finished at step {STEPS}" in log


@pytest.mark.slow
def test_a_try_that_failed_before_any_new_checkpoint_stops_the_job_as_a_crash_loop(failed_jobs, slurm_cluster):
    tmp, _, state = failed_jobs["loop"]
    log = job_log(tmp)
    assert state == "FAILED", f"{log[-8000:]}\n{slurm_cluster.logs()}"
    crash_loop = (r"try 1 failed \([^)]*\) before writing a new checkpoint \(the run's newest complete checkpoint: "
                  r"none yet\): the next try would fail the same way \(a crash loop\), so the run stops here")
    assert re.search(crash_loop, log), log[-8000:]
    assert starts(tmp, 0) == [0] and "try 2" not in log


@pytest.mark.slow
def test_a_hanging_wandb_does_not_keep_the_job_from_being_requeued(slurm_cluster, tmp_path, small_shards):
    job = submit(slurm_cluster, tmp_path, small_shards, 1, {"PARK_AT_STEP": "2", "REQUEUE_WANDB_TIMEOUT_S": "5"},
                 "logger=wandb_offline")
    wandb_core = None
    try:
        slurm_cluster._wait(lambda: (tmp_path / "records" / "parked-rank0").exists(), 300, "the job did not park")
        rank = int((tmp_path / "records" / "parked-rank0").read_text())
        wandb_core = next(pid for pid in children(rank) if Path(f"/proc/{pid}/comm").read_text().strip()
                          == "wandb-core")
        os.kill(wandb_core, signal.SIGSTOP)         # W&B answers nothing from now on
        slurm_cluster.run("scancel", "--signal=USR1", job, check=True)
        slurm_cluster._wait(lambda: slurm_cluster.job_field(job, "Restarts") == "1", 120,
                            "the job was not requeued while W&B hung")
        slurm_cluster._wait(lambda: f"requeued as job {job} at step" in job_log(tmp_path), 60,
                            "the rank did not say it was requeued")
    except (TimeoutError, StopIteration) as error:
        raise AssertionError(f"{error}\n{job_log(tmp_path)[-8000:]}") from None
    finally:
        slurm_cluster.run("scancel", job)
        if wandb_core is not None:
            for signum in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(wandb_core, signum)
                except ProcessLookupError:
                    pass
    log = job_log(tmp_path)
    assert "W&B did not finish the run within 5 s (REQUEUE_WANDB_TIMEOUT_S): requeueing without it" in log, log[-8000:]
    assert re.search(rf"requeued as job {job} at step 3: it resumes from", log), log[-8000:]


def children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(child) for child in found]


@pytest.mark.slow
def test_a_job_stopped_with_scancel_signal_term_is_neither_finished_nor_started_again(slurm_cluster, tmp_path,
                                                                                      small_shards):
    """`scancel --signal=TERM <job>` (issue 49, item 1) reaches every task of the step once the first checkpoint is
    on disk: the trainer exits 143, restarts.py does not start it again, and the job ends FAILED with 143, the run
    unfinished (no export). On ca8c0b7 the trainer exited 0, and the job COMPLETED."""
    job = submit(slurm_cluster, tmp_path, small_shards, 1, {}, "trainer.max_steps=400", "export.hf=true")
    checkpoint = tmp_path / "run" / "checkpoints" / f"step{CHECKPOINT_EVERY:07d}.ckpt"
    try:
        slurm_cluster._wait(checkpoint.exists, 300, "the job wrote no first checkpoint")
    except TimeoutError as error:
        slurm_cluster.run("scancel", job)
        raise AssertionError(f"{error}\n{job_log(tmp_path)[-8000:]}") from None
    slurm_cluster.run("scancel", "--signal=TERM", job, check=True)
    state = slurm_cluster.wait_for_job(job, timeout_s=300)
    log = job_log(tmp_path)
    print(f"job state after scancel --signal=TERM: {state}, exit code {slurm_cluster.job_field(job, 'ExitCode')}")
    assert state == "FAILED", f"{log[-8000:]}\n{slurm_cluster.logs()}"
    assert slurm_cluster.job_field(job, "ExitCode").startswith("143:"), log[-8000:]
    assert "try 1 was stopped (SIGTERM" in log and "try 2" not in log, log[-8000:]
    assert "run finished" not in log and not (tmp_path / "run" / "hf_export").exists()
