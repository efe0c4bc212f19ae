"""A multi-node job whose host name resolves to a loopback address (Debian's 127.0.1.1 in /etc/hosts) would hang for
30 minutes in gloo at its first step: train.sbatch stops before any task starts, and every rank stops before it
makes the requeue's gloo group, each saying what to set. The host name is set in a UTS namespace of the test's own
(`unshare --uts`, root) to `localhost`, which the real resolver maps to 127.0.0.1; one host cannot show the hang
itself (every address of one host reaches it)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
REFUSAL = "this host's name 'localhost' resolves to 127.0.0.1, a loopback address (see /etc/hosts)"


def as_host_localhost(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs `unshare --uts` as root, to give the test a host name of its own")
    return subprocess.run(["unshare", "--uts", "sh", "-c", 'hostname localhost && exec "$@"', "sh", *command],
                          env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def local_address() -> str | None:
    """This host's address on its default route (no packet is sent), None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_a_host_name_that_resolves_to_loopback_is_refused_unless_the_interface_is_named():
    from pipeline.core.cluster.gloo_address import unreachable_gloo_problem

    problem = unreachable_gloo_problem("localhost", env={})
    assert problem.startswith(REFUSAL) and "Set GLOO_SOCKET_IFNAME to the network interface" in problem
    assert unreachable_gloo_problem("localhost", env={"GLOO_SOCKET_IFNAME": "eth0"}) is None
    address = local_address()
    if address is not None:
        assert unreachable_gloo_problem(address, env={}) is None


def train_sbatch(tmp_path: Path, nodes: int, **extra: str) -> tuple[subprocess.CompletedProcess, list[str] | None]:
    """train.sbatch under bash with a fake srun: what it printed, and the arguments srun got (None: never ran)."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(parents=True, exist_ok=True)
    (fake_bin / "srun").write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    (fake_bin / "srun").chmod(0o755)
    args = tmp_path / f"srun_args_{nodes}_{len(extra)}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GLOO_"))}
    env.update(PATH=f"{fake_bin}:{env['PATH']}", SRUN_ARGS=str(args), SLURM_SUBMIT_DIR=str(tmp_path),
               SLURM_JOB_ID="77", SLURM_JOB_NAME="bert-pretrain", SLURM_NNODES=str(nodes), SLURM_NTASKS_PER_NODE="8",
               SLURM_CPUS_PER_TASK="12", SLURM_JOB_NODELIST="gpu[01-04]", PYTHONPATH=str(REPO_ROOT), **extra)
    done = as_host_localhost(["bash", str(REPO_ROOT / "infra" / "slurm" / "train.sbatch")], env)
    return done, args.read_text().splitlines() if args.exists() else None


def test_train_sbatch_across_nodes_stops_before_any_task_on_a_loopback_host_name(tmp_path):
    done, srun = train_sbatch(tmp_path, 2)
    assert done.returncode == 1 and srun is None, done.stdout + done.stderr
    assert f"localhost: {REFUSAL}" in done.stderr
    done, srun = train_sbatch(tmp_path, 2, GLOO_SOCKET_IFNAME="eth0")     # the interface named: it runs
    assert done.returncode == 0 and srun is not None, done.stderr
    done, srun = train_sbatch(tmp_path, 1)                                # one node: any address will do
    assert done.returncode == 0 and srun is not None, done.stderr


def test_every_rank_of_a_multi_node_job_checks_before_making_the_requeue_group():
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("GLOO_SOCKET_IFNAME", None)
    code = "from pipeline.core.cluster.requeue import agreement_group; agreement_group(num_nodes=2)"
    done = as_host_localhost([sys.executable, "-c", code], env)
    assert done.returncode == 1 and f"RuntimeError: {REFUSAL}" in done.stderr, done.stderr[-3000:]


SIGTERM_SETUP = """
import sys, torch.distributed as dist, pytorch_lightning as pl
from pipeline.core.cluster.sigterm import HostSigtermAgreement
dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
trainer = pl.Trainer(accelerator="cpu", devices=1, num_nodes=2, strategy="ddp", logger=False)
HostSigtermAgreement().setup(trainer, pl.LightningModule(), "fit")
print("made the SIGTERM group")
"""


def test_every_rank_of_a_multi_node_job_checks_before_making_the_sigterm_group(tmp_path):
    """pipeline/core/cluster/sigterm.py's gloo group, made at the fit's setup by the real callback on a real Trainer
    of 2 nodes (this process alone in the training group: the check comes before any peer is needed)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("GLOO_SOCKET_IFNAME", None)
    done = as_host_localhost([sys.executable, "-c", SIGTERM_SETUP, str(tmp_path / "group")], env)
    assert done.returncode == 1 and f"RuntimeError: {REFUSAL}" in done.stderr, done.stdout + done.stderr[-3000:]
    done = as_host_localhost([sys.executable, "-c", SIGTERM_SETUP, str(tmp_path / "named")],
                             {**env, "GLOO_SOCKET_IFNAME": "lo"})      # the interface named: the group is made
    assert done.returncode == 0 and "made the SIGTERM group" in done.stdout, done.stderr[-3000:]
