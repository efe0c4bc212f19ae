"""After the requeue, a rank ignores SIGTERM until it exits: the requeue makes SLURM send it to every process, and
the fit's teardown restores the handler of before the fit (the default, which dies). Run in a process of its own,
since it changes the process's signal dispositions."""
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import signal, sys
import pytorch_lightning as pl
import torch
from pipeline.core.requeue import RequeueOnSignal, RequeueRequest, RequeueRequested


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
with RequeueRequest() as request:
    request.received = True          # as if SIGUSR1 had come: the callback saves and requeues at the next step
    trainer = pl.Trainer(max_steps=10, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=sys.argv[1],
                         callbacks=[RequeueOnSignal(request, sys.argv[1])])
    try:
        trainer.fit(Tiny(), torch.utils.data.DataLoader(torch.randn(40, 2), batch_size=2))
    except RequeueRequested as requeued:
        print("requeue:", requeued)
print("SIGTERM ignored after the fit:", signal.getsignal(signal.SIGTERM) == signal.SIG_IGN)
"""


def test_a_rank_ignores_sigterm_from_its_requeue_until_it_exits(tmp_path):
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=300, env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the requeue failed" in result.stdout and "last.ckpt at step 1" in result.stdout, result.stdout
    assert "SIGTERM ignored after the fit: True" in result.stdout, result.stdout
