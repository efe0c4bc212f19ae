"""After the requeue, a rank ignores SIGTERM until it exits: the requeue makes SLURM send it to every process, and
the fit's teardown restores the handler of before the fit (the default, which dies). The same SIGTERM kills the rank's
loader workers, and the rank still stops as requeued. Run in a process of its own, since it changes the process's
signal dispositions."""
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import multiprocessing, signal, subprocess, sys, time
import pytorch_lightning as pl
import torch
from pipeline.core.cluster.requeue import RequeueOnSignal, RequeueRequest, RequeueRequested


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


# SLURM's SIGTERM after `scontrol requeue` reaches every process of the step, from slurmstepd: here from a process
# that is not the workers' parent (`kill`), while this rank waits for rank 0's outcome.
class SlurmTerminatesTheStep(RequeueOnSignal):

    def _from_rank_zero(self, outcome):
        workers = [str(child.pid) for child in multiprocessing.active_children()]
        assert workers, "the loader's workers are not running"
        subprocess.run(["kill", "-TERM", *workers], check=True)
        time.sleep(2)                # the workers' SIGCHLD reaches this process meanwhile
        return super()._from_rank_zero(outcome)


workers = int(sys.argv[2])
assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
with RequeueRequest() as request:
    request.received = True          # as if SIGUSR1 had come: the callback saves and requeues at the next step
    callback = (SlurmTerminatesTheStep if workers else RequeueOnSignal)(request, sys.argv[1])
    trainer = pl.Trainer(max_steps=10, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=sys.argv[1], callbacks=[callback])
    try:
        trainer.fit(Tiny(), torch.utils.data.DataLoader(torch.randn(40, 2), batch_size=2, num_workers=workers))
    except RequeueRequested as requeued:
        print("requeue:", requeued)
print("SIGTERM ignored after the fit:", signal.getsignal(signal.SIGTERM) == signal.SIG_IGN)
"""


def run_requeued_fit(run_dir: Path, loader_workers: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(run_dir), str(loader_workers)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"})


def test_a_rank_ignores_sigterm_from_its_requeue_until_it_exits(tmp_path):
    result = run_requeued_fit(tmp_path, loader_workers=0)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the requeue failed" in result.stdout and "last.ckpt at step 1" in result.stdout, result.stdout
    assert "SIGTERM ignored after the fit: True" in result.stdout, result.stdout


def test_loader_workers_killed_by_the_requeues_sigterm_do_not_crash_the_rank(tmp_path):
    # torch's worker handler dies of a SIGTERM that does not come from its parent, and torch's SIGCHLD handler in the
    # rank then raised "DataLoader worker (pid ...) is killed by signal: Terminated": the rank exited 1, not as
    # requeued (seen on the real SLURM under load, tests/pretraining/test_slurm_requeue.py).
    result = run_requeued_fit(tmp_path, loader_workers=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "killed by signal" not in result.stderr, result.stderr[-3000:]
    assert "the requeue failed" in result.stdout and "last.ckpt at step 1" in result.stdout, result.stdout
