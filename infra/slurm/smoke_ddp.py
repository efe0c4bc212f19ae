"""Cluster smoke check: a tiny Lightning DDP fit in every task of a SLURM allocation, in seconds.

    srun python infra/slurm/smoke_ddp.py [--out DIR] [--strategy conf/training/strategy/ddp.yaml] [--steps N]

Run it with the same #SBATCH/srun geometry as the real job (e.g. `--nodes=2 --ntasks-per-node=8 --gpus-per-node=8`)
before spending a queue slot on bert_large: it checks that Lightning detects SLURM, that every rank joins one
process group (nccl on GPUs, gloo on CPUs), that gradients are all-reduced (every rank ends with the same weights),
and that the requeue's own gloo group (pipeline/core/cluster/requeue.py, made as a training makes it) connects every
rank across nodes: one all-reduce over it, in at most a minute (a host name resolving to a loopback address is refused
first, saying what to set). Each rank prints one JSON line, and writes it to DIR/rank<N>.json when --out is given.
Exit status 0 means every rank finished; tests/pretraining/test_slurm.py submits it to a real single-node SLURM.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import socket
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from pipeline.core.cluster.requeue import agreement_group  # noqa: E402
from pipeline.core.speed.strategies import build_strategy  # noqa: E402


class TinyRegression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for rank<N>.json")
    parser.add_argument("--strategy", type=Path, default=REPO_ROOT / "conf" / "training" / "strategy" / "ddp.yaml")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    devices = int(os.environ.get("SLURM_NTASKS_PER_NODE", "1"))
    num_nodes = int(os.environ.get("SLURM_NNODES", "1"))
    strategy = build_strategy(OmegaConf.load(args.strategy), precision="32", gradient_clip_val=None,
                              micro_batch_size=8, accumulate_grad_batches=1, accelerator=accelerator)
    pl.seed_everything(0)
    x = torch.randn(256, 16, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=8)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    model = TinyRegression()
    trainer = pl.Trainer(accelerator=accelerator, devices=devices, num_nodes=num_nodes, strategy=strategy,
                         max_steps=args.steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, train_dataloaders=loader)

    weights = torch.cat([p.detach().cpu().flatten() for p in model.parameters()])
    requeue_ranks = None
    if torch.distributed.is_initialized():
        # One all-reduce over the requeue's gloo group, as its agreement runs at every step: each rank counts 1
        group = agreement_group(num_nodes, timeout=datetime.timedelta(seconds=60))
        count = torch.ones(1, dtype=torch.int32)
        torch.distributed.all_reduce(count, group=group)
        requeue_ranks = int(count.item())
    report = {
        "global_rank": trainer.global_rank,
        "local_rank": trainer.local_rank,
        "node_rank": trainer.node_rank,
        "world_size": trainer.world_size,
        "cluster_environment": type(trainer.strategy.cluster_environment).__name__,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "requeue_group_ranks": requeue_ranks,       # world_size: the gloo group reached every rank
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_procid": os.environ.get("SLURM_PROCID"),
        "host": socket.gethostname(),
        "global_step": trainer.global_step,
        "weights_sha256": hashlib.sha256(weights.numpy().tobytes()).hexdigest(),
    }
    print(json.dumps(report), flush=True)
    if args.out:
        (args.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
