"""A real single-node SLURM (slurmctld + slurmd + munged, with accounting: slurmdbd on a MariaDB server) for the tests
that need one. Needs Debian's slurm-wlm, slurmdbd and mariadb-server (CI installs them) and root (slurmd launches the
job's tasks). Every daemon runs in the foreground as a child of the test session, with its own munge key, socket,
ports, database and state directory, so nothing on the machine (a system munged or MariaDB, another SLURM) is touched,
and teardown stops exactly them.

Accounting is what `sacct` reads: Snakemake's SLURM executor tracks its jobs with it (without it the executor falls
back to squeue and loses the jobs that left the queue). One file outside the session's directory is written:
/run/slurm/conf/slurm.conf, a link to this cluster's slurm.conf, where a configless slurmd serves the config to the
node's clients. Job steps started by that executor lose SLURM_CONF (it strips SLURM_* variables before its nested
srun), and find the config there, as they would on a configless cluster."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

SLURM_APT_COMMAND = ("apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm slurmdbd "
                     "mariadb-server faketime")
SLURM_DAEMONS = ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "mariadb-install-db", "sbatch", "sacct",
                 "sacctmgr", "scontrol")
CLUSTER_NAME = "berttest"
ACCOUNT = "bert"
NODE_CONF = Path("/run/slurm/conf/slurm.conf")
DB_PASSWORD = "slurmdbd-test"      # a server of the session's own, on 127.0.0.1 only
SLURM_JOB_TIMEOUT_S = 240
SLURM_TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                         "DEADLINE", "PREEMPTED"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slurm_conf(root: Path, ctld_port: int, slurmd_port: int, dbd_port: int) -> str:
    # CPUs and memory: more than this machine has (config_overrides takes the config's word for it), so that a
    # controller job and a two-task stage job fit at once; the tests' jobs are small. task/affinity binds where the
    # node's CPUs are real; here a test reads what a job step was given from its processes. MinJobAge: a finished
    # job leaves slurmctld (squeue, scontrol) within seconds, as on a busy cluster, and is then known to sacct only.
    return f"""\
ClusterName={CLUSTER_NAME}
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
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={dbd_port}
AccountingStoragePass={root}/munge.socket
AccountingStoreFlags=job_comment
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
MinJobAge=10
NodeName=localhost CPUs=4 RealMemory=16000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _slurmdbd_conf(root: Path, dbd_port: int, mysql_port: int) -> str:
    return f"""\
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
DbdHost=localhost
DbdPort={dbd_port}
SlurmUser=root
PidFile={root}/slurmdbd.pid
LogFile={root}/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={mysql_port}
StorageUser=slurm
StoragePass={DB_PASSWORD}
StorageLoc=slurm_acct_db
"""


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.env["SLURM_CONF"] = str(self.conf)
        self.daemons: list[tuple[str, subprocess.Popen]] = []
        self.account = ACCOUNT
        self.started = ""               # sacct's --starttime for every job of this cluster (start() sets it)

    def start(self) -> None:
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S")
        for d in ("state", "spool"):
            (self.root / d).mkdir()
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        mysql_port, dbd_port = _free_port(), _free_port()
        self.conf.write_text(_slurm_conf(self.root, _free_port(), _free_port(), dbd_port))
        dbd_conf = self.root / "slurmdbd.conf"          # slurmdbd reads it beside slurm.conf; it must be private
        dbd_conf.write_text(_slurmdbd_conf(self.root, dbd_port, mysql_port))
        dbd_conf.chmod(0o600)
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={self.root}/munge.socket",
                               f"--key-file={key}", f"--log-file={self.root}/munged.log",
                               f"--pid-file={self.root}/munged.pid", f"--seed-file={self.root}/munged.seed"])
        self._start_database(mysql_port)
        self._wait(lambda: (self.root / "munge.socket").exists(), 20, "munged did not create its socket")
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        self._wait(lambda: self.run("sacctmgr", "-n", "list", "cluster").returncode == 0, 60,
                   "slurmdbd did not answer")
        for command in (("add", "cluster", CLUSTER_NAME), ("add", "account", ACCOUNT, f"Cluster={CLUSTER_NAME}"),
                        ("add", "user", "root", f"Account={ACCOUNT}", f"Cluster={CLUSTER_NAME}")):
            self.run("sacctmgr", "-i", *command, check=True)
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", "localhost"])
        self._wait(lambda: self.run("sinfo", "-h", "-o", "%t").stdout.strip() == "idle", 60,
                   "the node never became idle")
        self._serve_config()

    def _start_database(self, port: int) -> None:
        """A MariaDB server of its own (data directory, socket and port here) for slurmdbd."""
        data = self.root / "mysql"
        with open(self.root / "mariadb-install-db.out", "wb") as log:
            subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                            "--skip-test-db", "--auth-root-authentication-method=normal"],
                           stdout=log, stderr=subprocess.STDOUT, check=True, timeout=300)
        self._spawn("mariadbd", ["mariadbd", "--no-defaults", f"--datadir={data}", f"--socket={self.root}/mysql.sock",
                                 f"--port={port}", "--bind-address=127.0.0.1", "--user=root", "--skip-name-resolve",
                                 "--innodb-buffer-pool-size=16M", "--performance-schema=OFF",
                                 f"--log-error={self.root}/mariadbd.log"])
        self._wait(lambda: _port_open(port), 120, "MariaDB did not open its port")
        grant = (f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}'; "
                 "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
        self.run("mariadb", "--no-defaults", f"--socket={self.root}/mysql.sock", "-u", "root", "-e", grant, check=True)

    def _serve_config(self) -> None:
        NODE_CONF.parent.mkdir(parents=True, exist_ok=True)
        temporary = NODE_CONF.with_name(f".slurm.conf.{os.getpid()}")
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(self.conf)
        os.replace(temporary, NODE_CONF)

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
        if not match and field in ("JobState", "ExitCode"):          # the job has left slurmctld (MinJobAge)
            sacct = self.run("sacct", "-X", "-n", "-P", "-j", job_id, "-o", field.replace("Job", "")).stdout.split()
            return sacct[-1].split()[0] if sacct else ""
        return match.group(1) if match else ""

    def wait_for_job(self, job_id: str, timeout_s: float = SLURM_JOB_TIMEOUT_S) -> str:
        self._wait(lambda: self.job_field(job_id, "JobState") in SLURM_TERMINAL_STATES, timeout_s,
                   f"job {job_id} did not finish")
        return self.job_field(job_id, "JobState")

    def accounted_jobs(self) -> list[dict[str, str]]:
        """Every job the cluster ran (sacct, allocations only): id, name, comment, state, exit code. Without
        --starttime (and without -j), sacct shows only the jobs of today since 00:00: a session that runs past
        midnight would lose the jobs of the day before."""
        fields = ("JobID", "JobName", "Comment", "State", "ExitCode")
        out = self.run("sacct", "-X", "-n", "-P", "-a", "-S", self.started,
                       "-o", ",".join(f"{f}%200" for f in fields), check=True)
        return [dict(zip(fields, line.split("|"))) for line in out.stdout.splitlines() if line.strip()]

    def logs(self) -> str:
        parts = []
        for path in sorted(self.root.glob("*.out")) + sorted(self.root.glob("*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        if NODE_CONF.is_symlink() and os.readlink(NODE_CONF) == str(self.conf):
            NODE_CONF.unlink(missing_ok=True)
        for _name, proc in reversed(self.daemons):     # slurmd, slurmctld, slurmdbd, MariaDB, then munged
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0
