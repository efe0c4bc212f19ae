"""infra/slurm/train.sbatch on the real local SLURM, as users run it: 2 ranks (srun, DDP over gloo), 2 loader workers
per rank, W&B offline. One job lives through everything that stops a try, one after the other, and resumes each time:

0. `scontrol requeue` (as a node failure or a preemption without signal): the next start resumes from the newest
   periodic checkpoint, and nothing written since is lost;
1. SIGUSR1 to the batch shell only (`scancel --batch`, as `--signal=B:USR1@N`);
2. SIGUSR1 to every process of the job step (`scancel --signal=USR1 <job>`, as `--signal=USR1@N`): the loader
   workers get it too;
3. SIGUSR1 to one rank only: the ranks still agree, and save at the same step;
4. the last start runs to the end.

After each signal the ranks save at the next optimizer step and requeue the job themselves; the W&B run is marked
preempted and continued. Both ranks' losses of every micro-batch equal those of an uninterrupted run, bit for bit.
A gate in the job (a callback) holds each start at a known step until the test has sent what it sends there, so the
steps are fixed whatever the load of the machine.
"""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.checkpoints.checkpoint_files import newest_complete_checkpoint
from pipeline.core.cluster.requeue import REQUEUED_EXIT_CODE
from tests.helpers.training import run_two_rank_training

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS = 14
GATES = (5, 6, 9, 11)      # the step each start waits at, by SLURM_RESTART_COUNT; the last start has none
SAVED = (None, 7, 10, 12)  # where starts 1-3 save: the step boundary after their gate
CHECKPOINT_EVERY = 4


def overrides(shards: Path, *extra: str) -> list[str]:
    # Per rank 2 micro-batches of ONE sequence a step (rows of many lengths: the ranks draw different amounts of
    # dropout randomness), 2 loader workers.
    return ["+experiment=cpu_hour", f"data.path={shards}", "strategy=ddp", "data.global_batch_size=4",
            "data.micro_batch_size=1", "data.num_workers=2", f"trainer.max_steps={STEPS}",
            "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
            "scheduler.warmup_steps=2", "scheduler.warmup_fraction=null",
            f"callbacks.checkpoint.every_n_train_steps={CHECKPOINT_EVERY}", "export.hf=false", "export.plot=false",
            *extra]


# pipeline/train.py, run as train.sbatch runs it, with two callbacks added: each rank's loss of every micro-batch
# (the float's exact bits) to OUT/rank<R>.jsonl, and the gate.
WRAPPER = """
import json, os, runpy, sys, time
import pytorch_lightning as pl
import pipeline.pretraining.run as run
from pipeline.core.cluster.requeue import RequeueOnSignal

out, start = os.environ["RECORDS"], int(os.environ.get("SLURM_RESTART_COUNT", "0"))
gates = [int(g) for g in os.environ["GATES"].split(",")]


class Record(pl.Callback):
    def _write(self, trainer, record):
        with open(os.path.join(out, f"rank{trainer.global_rank}.jsonl"), "a") as handle:
            handle.write(json.dumps({"start": start, **record}) + "\\n")

    def on_train_start(self, trainer, pl_module):
        self._write(trainer, {"start_step": trainer.global_step})

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._write(trainer, {"step": self.step, "batch": batch_idx, "loss": float(outputs["loss"]).hex()})


class Gate(pl.Callback):
    '''Holds this start at its gate's step: tells the test (parked-<start>-rank<R>, holding the pid), waits for
    release-<start> (the ranks that were sent the signal), and for the signal itself on those ranks.'''
    done = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.done or start >= len(gates) or trainer.global_step != gates[start]:
            return
        self.done = True
        rank = trainer.global_rank
        with open(os.path.join(out, f"parked-{start}-rank{rank}"), "w") as handle:
            handle.write(str(os.getpid()))
        release = os.path.join(out, f"release-{start}")
        request = next(c for c in trainer.callbacks if isinstance(c, RequeueOnSignal)).request
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not trainer.received_sigterm:
            if os.path.exists(release):
                signalled = open(release).read().split()
                if str(rank) not in signalled or request.received:
                    return
            time.sleep(0.05)


class Lag(pl.Callback):
    '''Rank 1 comes 3 s late to each requeue, as a rank still waiting for its next batch would: the requeue makes
    SLURM send SIGTERM to every process, so rank 0 must not run it before every rank is ready for that.'''

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        requeue = next(c for c in trainer.callbacks if isinstance(c, RequeueOnSignal))
        if trainer.global_rank == 1 and requeue._saved is not None:
            time.sleep(3)


train = run.train
run.train = lambda cfg, extra_callbacks=(): train(cfg, extra_callbacks=[*extra_callbacks, Record(), Gate(), Lag()])
runpy.run_path(os.path.join(os.environ["REPO_ROOT"], "pipeline", "train.py"), run_name="__main__")
"""


def job_script(tmp_path: Path) -> Path:
    """infra/slurm/train.sbatch as it is, but for the GPUs this node has not, and pipeline/train.py run through the
    wrapper above."""
    text = (REPO_ROOT / "infra" / "slurm" / "train.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=8\n" in text and "srun --kill-on-bad-exit=1 python pipeline/train.py " in text
    wrapper = tmp_path / "train_with_records.py"
    wrapper.write_text(WRAPPER)
    text = text.replace("#SBATCH --gpus-per-node=8\n", "").replace(
        "srun --kill-on-bad-exit=1 python pipeline/train.py ", f"srun --kill-on-bad-exit=1 {sys.executable} {wrapper} ")
    script = tmp_path / "train.sbatch"
    script.write_text(text)
    return script


def records(out: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]


def losses(lines: list[dict]) -> dict[tuple[int, int], str]:
    """(step, micro-batch) -> loss bits; a micro-batch trained twice (before and after a resume): the later one."""
    return {(r["step"], r["batch"]): r["loss"] for r in lines if "loss" in r}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, wiki_shards):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    out = tmp / "records"
    done = run_two_rank_training(tmp, out, overrides(wiki_shards, f"output_dir={tmp / 'run'}", "trainer.devices=2"))
    assert done.returncode == 0, done.stderr[-6000:]
    return {rank: losses([json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()])
            for rank in (0, 1)}


@pytest.fixture(scope="module")
def requeued_job(slurm_cluster, tmp_path_factory, wiki_shards):
    """The job of the module docstring; returns what the tests read."""
    tmp = tmp_path_factory.mktemp("requeued_job")
    out, run_dir = tmp / "records", tmp / "run"
    out.mkdir()
    env = {**slurm_cluster.env, "RUN_DIR": str(run_dir), "EXPERIMENT": "cpu_hour", "RECORDS": str(out),
           "GATES": ",".join(map(str, GATES)), "REPO_ROOT": str(REPO_ROOT), "PYTHONPATH": str(REPO_ROOT),
           "WANDB_CONFIG_DIR": str(tmp / "wandb_config"), "MKL_NUM_THREADS": "2"}   # train.sbatch must override it
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--time=00:30:00",
         "--job-name=bert-requeue", f"--output={tmp}/slurm-%j.out", str(job_script(tmp)),
         *overrides(wiki_shards, "logger=wandb_offline")[1:]],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True)
    job = submitted.stdout.strip().split(";")[0]
    seen: dict = {"job": job, "out": out, "run_dir": run_dir, "log": lambda: job_log(tmp, slurm_cluster),
                  "job_log": lambda: next(tmp.glob("slurm-*.out")).read_text(errors="replace")}

    def parked(start: int) -> list[int]:
        slurm_cluster._wait(lambda: all((out / f"parked-{start}-rank{r}").exists() for r in (0, 1)), 300,
                            f"start {start} did not reach step {GATES[start]}")
        return [int((out / f"parked-{start}-rank{r}").read_text()) for r in (0, 1)]

    def requeued(start: int) -> None:
        """The job went back to the queue (its start-th requeue); start it now rather than in ~2 min."""
        slurm_cluster._wait(lambda: slurm_cluster.job_field(job, "Restarts") == str(start)
                            and slurm_cluster.job_field(job, "JobState") == "PENDING", 180,
                            f"the job was not requeued a {start}th time")
        slurm_cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=True)

    try:
        parked(0)
        seen["newest_at_requeue"] = newest_complete_checkpoint(run_dir / "checkpoints", run_dir)
        seen["files_at_requeue"] = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*")
                                    if p.is_file() and ("checkpoints" in p.parts or p.name == "metrics.csv")}
        slurm_cluster.run("scontrol", "requeue", job, check=True)
        requeued(1)
        parked(1)
        slurm_cluster.run("scancel", "--batch", "--signal=USR1", job, check=True)
        (out / "release-1").write_text("0 1")
        requeued(2)
        parked(2)
        slurm_cluster.run("scancel", "--signal=USR1", job, check=True)
        (out / "release-2").write_text("0 1")
        requeued(3)
        _, rank1 = parked(3)
        os.kill(rank1, signal.SIGUSR1)
        (out / "release-3").write_text("1")
        requeued(4)
        seen["state"] = slurm_cluster.wait_for_job(job, timeout_s=300)
    except (TimeoutError, RuntimeError) as error:
        slurm_cluster.run("scancel", job)
        raise AssertionError(f"{error}\n{seen['log']()}") from None
    return seen


def job_log(tmp: Path, cluster) -> str:
    log = next(tmp.glob("slurm-*.out"), None)
    return (log.read_text(errors="replace")[-8000:] if log else "(no job output)") + "\n" + cluster.logs()


@pytest.mark.slow
def test_the_job_ran_every_start_to_the_end(requeued_job):
    assert requeued_job["state"] == "COMPLETED", requeued_job["log"]()
    for rank in (0, 1):
        starts = [r["start_step"] for r in records(requeued_job["out"], rank) if "start_step" in r]
        # 0: the first start; 4: the newest periodic checkpoint when `scontrol requeue` hit at step 5; then the step
        # boundary after each signal
        assert starts == [0, CHECKPOINT_EVERY, *SAVED[1:]], (rank, starts)


@pytest.mark.slow
def test_a_requeue_without_signal_resumes_from_the_newest_checkpoint_and_loses_nothing(requeued_job):
    run_dir = requeued_job["run_dir"]
    assert requeued_job["newest_at_requeue"] is not None, "no periodic checkpoint before the requeue"
    before = requeued_job["files_at_requeue"]
    step_checkpoints = [p for p in before if p.name.startswith("step")]
    assert [p.name for p in step_checkpoints] == [f"step{CHECKPOINT_EVERY:07d}.ckpt"]
    for path in step_checkpoints:           # not rewritten by a start from step 0
        assert (run_dir / path).read_bytes() == before[path], path
    # The log of the steps trained after that checkpoint (the step the requeue cut short included) is kept: the
    # resumed starts appended to it.
    metrics = next(p for p in before if p.name == "metrics.csv")
    rows_before = list(csv.DictReader(before[metrics].decode().splitlines()))
    with open(run_dir / metrics, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows_before and [{k: row[k] for k in rows_before[0]} for row in rows[:len(rows_before)]] == rows_before
    # ... and held a step trained after the checkpoint (logged as step 4: the fifth), which the resume trained again
    assert max(int(float(row["step"])) for row in rows_before if row.get("train/loss")) >= CHECKPOINT_EVERY
    assert set(range(STEPS)) <= {int(float(row["step"])) for row in rows if row.get("train/loss")}


@pytest.mark.slow
def test_every_signal_saved_and_requeued_at_the_next_step(requeued_job):
    log = requeued_job["job_log"]()
    tries = re.split(rf"job {requeued_job['job']} restart \d+:", log)[1:]      # train.sbatch's line at every start
    assert len(tries) == len(GATES) + 1, log[-8000:]
    for step, text in zip(SAVED[1:], tries[1:len(GATES)]):
        assert f"requeued as job {requeued_job['job']} at step {step}: it resumes from" in text, text[-8000:]
        # srun's lines of the ranks' exits ("task 1: ...", or "tasks 0-1: ..."): both ranks, status 75
        exits = re.findall(r"tasks? ([0-9,-]+): Exited with exit code (\d+)", text)
        ranks = {r for tasks, _ in exits for part in tasks.split(",")
                 for r in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)}
        assert ranks == {0, 1} and {code for _, code in exits} == {str(REQUEUED_EXIT_CODE)}, exits


@pytest.mark.slow
def test_both_ranks_losses_equal_an_uninterrupted_run_bitwise(requeued_job, uninterrupted):
    for rank in (0, 1):
        got, expected = losses(records(requeued_job["out"], rank)), uninterrupted[rank]
        assert len(expected) == 2 * STEPS and got.keys() == expected.keys()
        different = [key for key in expected if got[key] != expected[key]]
        assert not different, f"rank {rank}: (step, micro-batch) {different}"


@pytest.mark.slow
def test_the_wandb_run_is_marked_preempted_at_each_signal_and_continued(requeued_job, read_wandb_history):
    from tests.helpers.wandb_log import read_wandb_records

    wandb_dir = requeued_job["run_dir"] / "wandb"
    run_id = (wandb_dir / "run_id").read_text().strip()
    starts = sorted(wandb_dir.glob("offline-run-*"), key=lambda p: p.name)
    assert len(starts) == 5 and {p.name.rsplit("-", 1)[1] for p in starts} == {run_id}
    kinds = []
    for start in starts[1:]:
        found = [r for log in start.glob("run-*.wandb") for r in read_wandb_records(log)]
        assert {r.run.run_id for r in found if r.WhichOneof("record_type") == "run"} == {run_id}, start
        exits = [r.exit.exit_code for r in found if r.WhichOneof("record_type") == "exit"]
        kinds.append((any(r.WhichOneof("record_type") == "preempting" for r in found), exits))
    # the three signalled starts were preempted; the last one finished
    assert kinds == [(True, [REQUEUED_EXIT_CODE])] * 3 + [(False, [0])], kinds
    steps = [row["trainer/global_step"] for start in starts for log in start.glob("run-*.wandb")
             for row in read_wandb_history(log) if "train/loss" in row]
    # Every step from the checkpoint the second start resumed from on, the step each signal saved at included. The
    # start that `scontrol requeue` killed (SIGTERM to every process of the step, W&B's service too) wrote nothing to
    # its W&B file: W&B had not written it yet. Its steps are in the CSV log (the test above).
    assert set(range(CHECKPOINT_EVERY, STEPS)) <= set(steps)


@pytest.mark.slow
def test_a_failed_requeue_says_why(slurm_cluster, monkeypatch):
    """The real scontrol's answer for a job it cannot requeue reaches the error (the run then stops, its
    checkpoint saved, saying to submit it again)."""
    from pipeline.core.cluster.requeue import requeue_slurm_job

    for name, value in slurm_cluster.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_JOB_ID", "999999")
    with pytest.raises(RuntimeError, match=r"`scontrol requeue 999999` failed with exit status \d+: .*[Ii]nvalid job"):
        requeue_slurm_job()
