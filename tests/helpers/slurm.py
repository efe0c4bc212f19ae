"""A real single-node SLURM (slurmctld + slurmd + munged) for the tests that need one. Needs Debian's slurm-wlm (CI
installs it) and root (slurmd launches the job's tasks). Every daemon runs in the foreground as a child of the test
session, with its own munge key, socket, ports and state directory, so nothing on the machine (a system munged,
another SLURM) is touched, and teardown stops exactly them."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

SLURM_APT_COMMAND = "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm"
SLURM_JOB_TIMEOUT_S = 240
SLURM_TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                         "DEADLINE", "PREEMPTED"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slurm_conf(root: Path, ctld_port: int, slurmd_port: int) -> str:
    return f"""\
ClusterName=berttest
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
NodeName=localhost CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.env["SLURM_CONF"] = str(self.conf)
        self.daemons: list[tuple[str, subprocess.Popen]] = []

    def start(self) -> None:
        for d in ("state", "spool"):
            (self.root / d).mkdir()
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        self.conf.write_text(_slurm_conf(self.root, _free_port(), _free_port()))
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={self.root}/munge.socket",
                               f"--key-file={key}", f"--log-file={self.root}/munged.log",
                               f"--pid-file={self.root}/munged.pid", f"--seed-file={self.root}/munged.seed"])
        self._wait(lambda: (self.root / "munge.socket").exists(), 20, "munged did not create its socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", "localhost"])
        self._wait(lambda: self.run("sinfo", "-h", "-o", "%t").stdout.strip() == "idle", 60,
                   "the node never became idle")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / f"{name}.out", "wb")
        self.daemons.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)))

    def _wait(self, condition, timeout_s: float, message: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.daemons:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.logs()}")
            if condition():
                return
            time.sleep(0.5)
        raise TimeoutError(f"{message} within {timeout_s} s:\n{self.logs()}")

    def run(self, *cmd: str, check: bool = False) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60, check=check)

    def job_field(self, job_id: str, field: str) -> str:
        out = self.run("scontrol", "show", "job", job_id).stdout
        match = re.search(rf"\b{field}=(\S+)", out)
        return match.group(1) if match else ""

    def wait_for_job(self, job_id: str, timeout_s: float = SLURM_JOB_TIMEOUT_S) -> str:
        self._wait(lambda: self.job_field(job_id, "JobState") in SLURM_TERMINAL_STATES, timeout_s,
                   f"job {job_id} did not finish")
        return self.job_field(job_id, "JobState")

    def logs(self) -> str:
        parts = []
        for path in sorted(self.root.glob("*.out")) + sorted(self.root.glob("*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for name, proc in reversed(self.daemons):     # slurmd, slurmctld, then munged
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
