"""The address gloo (torch.distributed's CPU backend) takes on this host, and whether ranks on other nodes can reach it.

Without GLOO_SOCKET_IFNAME, gloo takes the first address that this host's name resolves to and that it can bind.
Many images map the host name to a loopback address in /etc/hosts (Debian and Ubuntu: 127.0.1.1). gloo then listens
there and gives that address to the other ranks, and a rank on another node, connecting to it, reaches itself: the
first gloo collective waits for its timeout, 30 minutes, and fails. A GPU job trains over NCCL, which finds its own
interfaces, and meets gloo only in the requeue's agreement (pipeline/core/cluster/requeue.py, at every optimizer step),
so such a job would hang at its first step. One node needs no network: every address is fine there.

So a multi-node job checks first: infra/slurm/train.sbatch runs this module on the batch node before any task
starts, and every rank checks before it creates a gloo group of its own (checked_gloo_group: the requeue's and the
SIGTERM's agreement; the workflow's jobs too). The way out is named in the message: GLOO_SOCKET_IFNAME=<the interface
the nodes reach each other on>, or a host name that resolves to it.

    python -m pipeline.core.cluster.gloo_address   # exits 1, saying why, where ranks on other nodes cannot reach gloo
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

INTERFACE_VARIABLE = "GLOO_SOCKET_IFNAME"


def gloo_address(hostname: str) -> str | None:
    """The address gloo binds for `hostname` (the first that resolves and binds, as gloo's createDeviceForHostname
    picks it), or None where none does (gloo then falls back to the loopback address)."""
    try:
        candidates = socket.getaddrinfo(hostname, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return None
    for family, kind, proto, _, address in candidates:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind((address[0], 0, *address[2:]))
                return address[0]
        except OSError:
            continue
    return None


def unreachable_gloo_problem(hostname: str | None = None, env: Mapping[str, str] = os.environ) -> str | None:
    """Why ranks on other nodes could not reach this host's gloo (for a multi-node job), or None."""
    if env.get(INTERFACE_VARIABLE):
        return None
    hostname = hostname or socket.gethostname()
    address = gloo_address(hostname)
    if address is not None and not ipaddress.ip_address(address.split("%")[0]).is_loopback:
        return None
    found = (f"resolves to {address}, a loopback address (see /etc/hosts)" if address
             else "does not resolve to an address (gloo falls back to the loopback address)")
    interfaces = ", ".join(name for _, name in socket.if_nameindex() if name != "lo") or "none found"
    return (f"this host's name {hostname!r} {found}: gloo, which the ranks use to agree on a requeue at every step, "
            f"would listen where the ranks on other nodes cannot reach it, and the job would hang for 30 minutes at "
            f"its first step. Set {INTERFACE_VARIABLE} to the network interface the nodes reach each other on (this "
            f"host has: {interfaces}), e.g. `{INTERFACE_VARIABLE}=<interface> sbatch ...`, or have the host name "
            "resolve to that interface's address")


def checked_gloo_group(num_nodes: int, timeout: datetime.timedelta | None = None) -> Any:
    """A process group of every rank over gloo (every rank calls this), for agreements on the host apart from the
    training group: the requeue's (pipeline/core/cluster/requeue.py) and the SIGTERM's
    (pipeline/core/cluster/sigterm.py). Across nodes, refuses an address the other nodes cannot reach instead of hanging
    at the first step."""
    # imported here: train.sbatch runs this module's check on the batch node, where torch need not be importable
    import torch.distributed as dist

    problem = unreachable_gloo_problem() if num_nodes > 1 else None
    if problem:
        raise RuntimeError(problem)
    return dist.new_group(backend="gloo", timeout=timeout)


def main() -> int:
    problem = unreachable_gloo_problem()
    if problem:
        print(f"{socket.gethostname()}: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
