"""Every node hashes its own copy of the shards (issue 49, item 14): a set staged to each node's local disk is read
there, and a copy corrupted on one node only must stop the run before it trains, naming the file.

Two "nodes" on this machine: two real `python pipeline/train.py` processes of one 2-node DDP run (gloo; NODE_RANK 0
and 1, each its node's local rank 0), the second in a mount namespace of its own (`unshare --mount`), where a corrupt
copy of one shard is bind-mounted over the set's file: the same path, other bytes, as a node-local copy that went bad
on one node. On ca8c0b7 only global rank 0 hashed, so node 1 went on to train on its corrupt copy.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.helpers.ranks import local_launch_env

NODE_OVERRIDES = ["trainer.num_nodes=2", "trainer.devices=1", "trainer.accelerator=cpu", "strategy=ddp",
                  "data.global_batch_size=4", "data.micro_batch_size=2", "data.num_workers=0", "trainer.max_steps=2",
                  "scheduler.warmup_steps=1", "export.hf=false", "export.plot=false",
                  "trainer.enable_progress_bar=false", "callbacks.checkpoint.every_n_train_steps=0"]


def can_bind_mount() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True)
    return probe.returncode == 0


def free_port() -> str:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.mark.skipif(not can_bind_mount(), reason="needs root and `unshare --mount` to give one node its own copy")
def test_a_copy_corrupt_on_one_node_stops_that_node_before_it_trains(small_shards, tmp_path):
    shards = shutil.copytree(small_shards, tmp_path / "shards")
    victim = sorted(shards.glob("*.parquet"))[0]
    corrupt = tmp_path / "node1-copy.parquet"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF                          # one byte flipped mid-file: the size still matches
    corrupt.write_bytes(bytes(data))
    command = [sys.executable, "pipeline/train.py", f"data.path={shards}", f"output_dir={tmp_path / 'run'}",
               *NODE_OVERRIDES]
    port = free_port()

    def node(rank: int, argv: list[str]) -> subprocess.Popen:
        env = local_launch_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2", NODE_RANK=str(rank),
                               RANK=str(rank), LOCAL_RANK="0")
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    node0 = node(0, command)
    mount_and_train = f'mount --bind "{corrupt}" "{victim}" && exec "$@"'
    node1 = node(1, ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount_and_train, "sh", *command])
    try:
        node1_output, _ = node1.communicate(timeout=300)
    finally:
        # srun --kill-on-bad-exit=1 (infra/slurm/train.sbatch) ends the step's other tasks when one fails
        time.sleep(1)
        node0.kill()
    node0_output, _ = node0.communicate()
    assert node1.returncode != 0, node1_output[-3000:]
    assert f"['{victim.name}'] differ from the sizes and sha256 in its manifest" in node1_output, node1_output[-3000:]
    assert "Nothing was trained" in node1_output
    assert "hashed" in node0_output and "differ from" not in node0_output, node0_output[-3000:]
    assert victim.read_bytes() != corrupt.read_bytes()    # node 0's copy, outside the namespace, is the good one
