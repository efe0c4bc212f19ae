"""SLURM's requeue signal reaches every process of the job step, the loader workers too: they live through it under
each multiprocessing start method (fork; forkserver, Python 3.14's default on Linux; spawn), and the loaders keep
yielding. A process of its own per start method, with the rank's real handler (RequeueRequest) installed as train()
installs it, signals its whole process group, as SLURM signals the step: mid-epoch, and again while the next epoch's
workers start."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.shard_sets import SMALL_BOOKS, shared_books_set

REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, multiprocessing, os, signal, sys


def signal_the_step():
    os.killpg(0, signal.SIGUSR1)    # this process (a rank), its loader workers, multiprocessing's helpers


def two_epochs(loader):
    # Batches of each epoch: the first signalled after its second batch, the second as its workers start.
    counts = []
    for epoch in range(2):
        batches = iter(loader)
        if epoch == 1:
            signal_the_step()
        n = 0
        for _ in batches:
            n += 1
            if epoch == 0 and n == 2:
                signal_the_step()
        counts.append(n)
    return counts


if __name__ == "__main__":     # (spawn and the forkserver run this file again, as __mp_main__: nothing to import)
    multiprocessing.set_start_method(sys.argv[1])
    import datasets, torch
    from pipeline.core.cluster.requeue import RequeueRequest
    from pipeline.finetuning.batches import FeatureRows, PaddingCollator, train_loader
    from pipeline.pretraining.data.dataset import PretrainingDataset
    from pipeline.pretraining.data.loader import PretrainingDataLoader
    from pipeline.pretraining.data.shard_set import ShardSet

    torch.set_num_threads(1)
    shards = ShardSet.open(sys.argv[2], max_seq_length=128, vocab_size=30522)
    columns = {"input_ids": [[101, 7, 102]] * 64, "token_type_ids": [[0, 0, 0]] * 64, "length": [3] * 64,
               "label": [0] * 64}
    rows = FeatureRows(datasets.Dataset.from_dict(columns), "classification")
    with RequeueRequest() as request:
        pretraining = PretrainingDataLoader(PretrainingDataset(shards, 128, num_workers=2))
        finetuning = train_loader(rows, 8, PaddingCollator(0), group_by_length=False, seed=0, num_workers=2)
        print(json.dumps({"pretraining": two_epochs(pretraining), "pretraining_len": len(pretraining.dataset),
                          "finetuning": two_epochs(finetuning), "received": request.received}))
"""


@pytest.fixture(scope="module")
def books_set(tmp_path_factory, shared_data):
    books = [shared_data / "corpora" / "books" / name for name in SMALL_BOOKS]
    return shared_books_set(tmp_path_factory, "static", books)


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_loader_workers_live_through_the_requeue_signal(start_method, books_set, tmp_path):
    script = tmp_path / "signalled_loaders.py"
    script.write_text(SCRIPT)
    # A session of its own: the signal goes to this process group only.
    done = subprocess.run([sys.executable, str(script), start_method, str(books_set)], cwd=REPO_ROOT,
                          env={**_env(), "PYTHONPATH": str(REPO_ROOT)}, capture_output=True, text=True, timeout=300,
                          start_new_session=True)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["pretraining"] == [seen["pretraining_len"]] * 2, seen      # every batch of both epochs
    assert seen["finetuning"] == [8, 8], seen
    assert seen["received"] is True                 # the rank itself took the request


def _env() -> dict[str, str]:
    import os
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
