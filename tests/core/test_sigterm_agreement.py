"""A SIGTERM still stops every rank together once Lightning's per-micro-batch broadcast is replaced by the host
agreement at optimizer-step boundaries (pipeline/core/cluster/sigterm.py): 2 CPU ranks (DDP over gloo), 2
micro-batches a step, rank 0 signalled in the middle of step 2; both ranks stop before step 3's first micro-batch,
with Lightning's SIGTERMException, and neither hangs."""
from __future__ import annotations

import json
import sys
import textwrap

from tests.helpers.ranks import local_launch_env, run_rank_group

SCRIPT = textwrap.dedent('''
    import json, os, signal, sys
    import pytorch_lightning as pl
    import torch
    from pipeline.core.cluster.sigterm import HostSigtermAgreement

    out = sys.argv[1]


    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)


    class Record(pl.Callback):
        batches = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.batches.append(batch_idx)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_rank == 0 and batch_idx == 4:      # the first micro-batch of step 2
                os.kill(os.getpid(), signal.SIGTERM)

        def on_exception(self, trainer, pl_module, exception):
            with open(f"{out}/rank{trainer.global_rank}.json", "w") as handle:
                loop = vars(trainer.fit_loop.epoch_loop)
                json.dump({"exception": type(exception).__name__, "batches": self.batches,
                           "global_step": trainer.global_step,
                           "lightning_check_replaced": "_broadcast_sigterm_tensor" in loop}, handle)


    data = torch.utils.data.TensorDataset(torch.randn(64, 2))
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=20, accumulate_grad_batches=2,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[HostSigtermAgreement(), Record()])
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))
''')


def test_a_sigterm_on_rank_0_stops_both_ranks_at_the_next_optimizer_step(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    proc = run_rank_group([sys.executable, str(script), str(tmp_path)], local_launch_env(), timeout_s=180)
    # Lightning's SIGTERMException is a SystemExit: the processes end with status 0, as under Lightning's own check.
    records = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, record in enumerate(records):
        assert record["exception"] == "SIGTERMException", (rank, proc.stderr[-3000:])
        assert record["batches"] == [0, 1, 2, 3, 4, 5] and record["global_step"] == 3, rank
        assert record["lightning_check_replaced"], rank
