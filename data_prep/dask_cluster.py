"""Beam's Dask runner, on a Dask cluster the job starts and stops itself or on one the user already runs.

    python data_prep/run.py preset=sample dask.cluster=local dask.workers=2          # a distributed.LocalCluster
    python data_prep/run.py preset=phase1 inputs=... output_dir=... dask.cluster=slurm dask.workers=16 \
        dask.slurm.partition=cpu dask.slurm.cores=4 dask.slurm.processes=4 dask.slurm.memory=16GB   # SLURM jobs
    python data_prep/run.py ... --runner=apache_beam.runners.dask.dask_runner.DaskRunner --dask_client_address=H:P

These are runner settings: they shape no data, so they stay out of PrepConfig and the manifest (the shards are
byte-identical to the DirectRunner's). Dask and dask-jobqueue are the optional `dask` extra, imported only here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from data_prep.presets import REPO_ROOT

log = logging.getLogger(__name__)

DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
CLUSTER_KINDS = ("none", "local", "slurm")
INSTALL_HINT = "pip install -e '.[dask]'"


@dataclasses.dataclass(frozen=True)
class SlurmWorkers:
    """The SLURM jobs that hold the workers (dask-jobqueue's SLURMCluster); `workers` worker processes in all."""
    partition: str | None = None       # sbatch --partition; None: the cluster's default partition
    account: str | None = None         # sbatch --account
    cores: int = 1                     # CPUs per job, shared by its worker processes
    processes: int = 1                 # worker processes per job (each gets cores / processes threads)
    memory: str = "4GB"                # per job, split between its processes (Dask pauses a worker near its share)
    walltime: str = "01:00:00"         # sbatch --time
    job_extra_directives: tuple[str, ...] = ()   # more sbatch options, e.g. [--qos=cpu]
    interface: str | None = None       # network interface for scheduler and workers, e.g. ib0; None: the hostname's
    log_directory: str | None = None   # the jobs' stdout/stderr; None: a new temporary directory
    startup_timeout_s: float = 600.0   # all workers connected within this, or the job stops with the queue's state


@dataclasses.dataclass(frozen=True)
class DaskSettings:
    cluster: str = "none"              # none | local | slurm: the Dask cluster this job starts and stops
    workers: int = 2                   # worker processes (one thread each on a LocalCluster)
    slurm: SlurmWorkers = SlurmWorkers()

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> DaskSettings:
        raw = dict(raw or {})
        _reject_unknown(raw, cls, "dask")
        slurm = dict(raw.pop("slurm", None) or {})
        _reject_unknown(slurm, SlurmWorkers, "dask.slurm")
        slurm["job_extra_directives"] = tuple(slurm.get("job_extra_directives") or ())
        settings = cls(**raw, slurm=SlurmWorkers(**slurm))
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.cluster not in CLUSTER_KINDS:
            raise ValueError(f"dask.cluster must be one of {', '.join(CLUSTER_KINDS)}, got {self.cluster!r}")
        if self.workers < 1:
            raise ValueError(f"dask.workers must be >= 1, got {self.workers}")
        if self.slurm.cores < 1 or self.slurm.processes < 1 or self.slurm.cores % self.slurm.processes:
            raise ValueError(f"dask.slurm.cores ({self.slurm.cores}) must be a positive multiple of "
                             f"dask.slurm.processes ({self.slurm.processes})")
        if self.cluster == "none":
            return
        try:
            import distributed  # noqa: F401
            if self.cluster == "slurm":
                import dask_jobqueue  # noqa: F401
        except ImportError as error:
            raise ValueError(f"dask.cluster={self.cluster} needs {error.name}: {INSTALL_HINT}") from None
        if self.cluster == "slurm" and shutil.which("sbatch") is None:
            raise ValueError("dask.cluster=slurm submits the workers with sbatch, which is not on the PATH")


def _reject_unknown(raw: dict, cls, prefix: str) -> None:
    known = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown option(s) {[f'{prefix}.{k}' for k in unknown]}; known: "
                         f"{sorted(f'{prefix}.{k}' for k in known)}")


def check_runner_choice(settings: DaskSettings, beam_args: list[str]) -> None:
    """dask.cluster=local|slurm means: the DaskRunner on the cluster started here. Say so if the Beam options
    name another runner or another cluster, rather than silently ignoring one of them."""
    if settings.cluster == "none":
        return
    runners = [a.split("=", 1)[1] for a in beam_args if a.startswith("--runner=")]
    if any(r not in (DASK_RUNNER, "DaskRunner") for r in runners):
        raise ValueError(f"dask.cluster={settings.cluster} runs on Beam's DaskRunner, but --runner={runners[0]} "
                         "was given; drop one of them")
    if any(a.startswith(("--dask_client_address", "--dask_scheduler_file")) for a in beam_args):
        raise ValueError(f"dask.cluster={settings.cluster} starts its own cluster; to use a running one, pass "
                         f"--runner={DASK_RUNNER} --dask_client_address=HOST:PORT without dask.cluster")


def uses_dask_runner(beam_args: list[str]) -> bool:
    return any(a in (f"--runner={DASK_RUNNER}", "--runner=DaskRunner") for a in beam_args)


def dask_runner_args(beam_args: list[str], scheduler_address: str | None, num_files: int,
                     num_workers: int | None = None) -> list[str]:
    """The Beam options for the DaskRunner: the cluster's address, and the bag partitioning of the input files
    unless the user chose one (--dask_npartitions / --dask_partition_size). The runner's own default (128 elements
    per partition) puts every file of a normal job into one task, so one worker would read them all (its Reshuffle
    is a no-op). One partition per file is the other extreme: every partition pays a DoFn set-up and the
    GroupByKey shuffles partitions x partitions pieces (16x benchmark corpus, 96 files, 2 workers: 72 s with 96
    partitions, 49 s with 4). So: two partitions per worker where the job knows the workers, else one per file."""
    args = list(beam_args)
    if scheduler_address is not None:
        args = [f"--runner={DASK_RUNNER}", f"--dask_client_address={scheduler_address}", *args]
    elif not uses_dask_runner(args):
        return args
    if not any(a.startswith(("--dask_npartitions", "--dask_partition_size")) for a in args):
        partitions = num_files if num_workers is None else min(num_files, 2 * num_workers)
        args.append(f"--dask_npartitions={max(partitions, 1)}")
    return args


def release_runner_client(result) -> None:
    """The DaskRunner's result holds a Client it never closes; left open, it keeps trying to reconnect (and logs
    errors for 30 s) once the cluster is gone."""
    client = getattr(result, "client", None)
    if client is not None:
        client.close()


@contextlib.contextmanager
def started_cluster(settings: DaskSettings) -> Iterator[str | None]:
    """The scheduler address of the cluster that dask.cluster asks for, closed on the way out; None for none."""
    if settings.cluster == "none":
        yield None
        return
    import distributed  # noqa: F401  (sets its logger's level on import)
    # Scheduler (here) and worker processes log every start, connection and stop at INFO; the job's summary is
    # what matters. Warnings and errors still show.
    logging.getLogger("distributed").setLevel(logging.WARNING)
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    if settings.cluster == "local":
        from distributed import LocalCluster
        # One thread per worker process: the tokenizer and the instance builder are CPU-bound Python. And worker
        # processes, never in-process workers: the DaskRunner's ParDo keeps its output list in an object of the
        # task graph, which tasks running in the client's own process share, so outputs repeat across bundles.
        with LocalCluster(n_workers=settings.workers, threads_per_worker=1, processes=True,
                          dashboard_address=":0") as cluster:   # any free port: the machine may run others
            log.info("Dask LocalCluster of %d worker processes at %s", settings.workers, cluster.scheduler_address)
            yield cluster.scheduler_address
    else:
        with _slurm_cluster(settings) as address:
            yield address


@contextlib.contextmanager
def _slurm_cluster(settings: DaskSettings) -> Iterator[str]:
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    spec = settings.slurm
    log_directory = spec.log_directory or tempfile.mkdtemp(prefix="data_prep-dask-slurm-")
    cluster = SLURMCluster(
        queue=spec.partition, account=spec.account, cores=spec.cores, processes=spec.processes,
        memory=spec.memory, walltime=spec.walltime, job_extra_directives=list(spec.job_extra_directives),
        interface=spec.interface, log_directory=log_directory, job_name="data_prep-dask",
        python=sys.executable,
        # The workers unpickle this checkout's DoFns: import data_prep from the same place as this process
        # (a shared filesystem, as SLURM jobs assume), even where another copy is pip-installed.
        job_script_prologue=[f"export PYTHONPATH={REPO_ROOT}${{PYTHONPATH:+:$PYTHONPATH}}",
                             "export RAYON_NUM_THREADS=1 OMP_NUM_THREADS=1"],
    )
    try:
        cluster.scale(n=settings.workers)
        log.info("Dask scheduler at %s; %d workers in SLURM jobs (logs in %s)", cluster.scheduler_address,
                 settings.workers, log_directory)
        with Client(cluster) as client:
            try:
                client.wait_for_workers(settings.workers, timeout=spec.startup_timeout_s)
            except TimeoutError:
                raise RuntimeError(
                    f"only {len(client.scheduler_info()['workers'])} of {settings.workers} Dask workers connected "
                    f"within {spec.startup_timeout_s:.0f} s (dask.slurm.startup_timeout_s): see `squeue` for jobs "
                    f"named data_prep-dask and their logs in {log_directory}; the job script was:\n"
                    f"{cluster.job_script()}") from None
        yield cluster.scheduler_address
    finally:
        cluster.close()
