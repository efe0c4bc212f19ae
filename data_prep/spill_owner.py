"""Who holds a spill, and when it may go.

The spill (data_prep.spill) is read by the job's shard writers until the job ends. A job on a remote runner
(Dataflow, Flink, Spark) outlives its launcher: Ctrl-C, a killed launcher or an interrupted wait stop the waiting,
not the job, and a spill removed under it fails the job hours later. So the launcher records the job in the spill
(owner.json: runner, job id, host, process, start time) and removes the spill only once the job's state is finished,
failed or cancelled; otherwise it leaves the spill and says where it is and how to remove it.

A later run of the same output that finds a spill removes it, and says so, when its job has ended for certain: the
job ran inside its launcher's process (DirectRunner, an embedded job service, the DaskRunner, whose cluster drops a
lost client's work) and that process is gone: on this host by its pid, on another node by the SLURM job it ran in
(ended, or requeued since, as a workflow stage's retry finds it). When the job may still run (a remote runner, a
launcher that still runs or cannot be seen, a spill that names no job) the run refuses before it touches anything,
naming the job.

    python -m data_prep.spill_owner OUTPUT_DIR            # whose spill it is, and whether that job may still run
    python -m data_prep.spill_owner OUTPUT_DIR --remove   # once that job has finished, failed or been cancelled
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import socket
import subprocess
import sys

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions, PortableOptions, StandardOptions
from apache_beam.runners.runner import PipelineState

from data_prep.process_start import process_alive, process_start
from data_prep.spill import remove_spill, spill_dir

log = logging.getLogger(__name__)

OWNER_NAME = "owner.json"
# The states after which no worker reads the spill again. UPDATED is left out: a replacement job goes on reading it.
ENDED_STATES = (PipelineState.DONE, PipelineState.FAILED, PipelineState.CANCELLED, PipelineState.DRAINED)
# Runners whose job lives and dies with the launcher's process.
_IN_LAUNCHER_RUNNERS = ("DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner", "FnApiRunner",
                        "DaskRunner")
# SLURM job states in which the job's processes may still run (PENDING: none, a requeue has ended them).
_SLURM_ACTIVE = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING")


class SpillInUse(ValueError):
    """A spill that a job may still read: the run stops before it changes anything in the output."""


@dataclasses.dataclass(frozen=True)
class SpillOwner:
    runner: str
    host: str
    pid: int
    process_start: str | None    # the launcher process's start (Linux /proc): a reused pid is not the launcher
    started: str                 # when the launcher claimed the spill (UTC)
    in_launcher: bool            # the job runs inside the launcher's process and ends with it
    job_id: str | None = None
    check_command: str | None = None   # how to ask the runner whether the job still runs
    slurm_job: str | None = None       # the SLURM job the launcher ran in, and which attempt of it: a launcher on
    slurm_restarts: int = 0            # another node is known gone once that attempt has ended

    def describe(self) -> str:
        job = f"job {self.job_id}" if self.job_id else "the job"
        return f"{job} on {self.runner}, launched {self.started} by process {self.pid} on {self.host}"


def owner_of_this_launcher(options) -> SpillOwner:
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    runner = runner if isinstance(runner, str) else type(runner).__name__
    name = runner.rsplit(".", 1)[-1]
    in_launcher = name in _IN_LAUNCHER_RUNNERS or (
        name == "PortableRunner" and options.view_as(PortableOptions).job_endpoint == "embed")
    check = None
    if name == "DataflowRunner":
        cloud = options.view_as(GoogleCloudOptions)
        check = f"gcloud dataflow jobs describe JOB_ID --project={cloud.project} --region={cloud.region}"
    return SpillOwner(runner=name, host=socket.gethostname(), pid=os.getpid(),
                      process_start=process_start(os.getpid()),
                      started=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                      in_launcher=in_launcher, check_command=check, slurm_job=os.environ.get("SLURM_JOB_ID"),
                      slurm_restarts=int(os.environ.get("SLURM_RESTART_COUNT") or 0))


def write_owner(output_dir: str, owner: SpillOwner) -> None:
    path = FileSystems.join(spill_dir(output_dir), OWNER_NAME)
    if "://" not in path:
        os.makedirs(spill_dir(output_dir), exist_ok=True)
    with FileSystems.create(path + ".tmp") as handle:
        handle.write(json.dumps(dataclasses.asdict(owner), indent=2).encode("utf-8"))
    if FileSystems.exists(path):
        FileSystems.delete([path])
    FileSystems.rename([path + ".tmp"], [path])


def read_owner(output_dir: str) -> SpillOwner | None:
    """The recorded owner of the spill in `output_dir`; None when no (readable) record is there."""
    path = FileSystems.join(spill_dir(output_dir), OWNER_NAME)
    try:
        with FileSystems.open(path) as handle:
            return SpillOwner(**json.loads(handle.read().decode("utf-8")))
    except (OSError, ValueError, TypeError):   # missing, half written, or not a record of ours
        return None


def spill_files(output_dir: str) -> list[str]:
    return [m.path for m in FileSystems.match([FileSystems.join(spill_dir(output_dir), "*")])[0].metadata_list]


def job_has_ended(owner: SpillOwner) -> tuple[bool, str]:
    """Whether the recorded job has ended for certain, and why (or why that cannot be told from here)."""
    if not owner.in_launcher:
        return False, (f"{owner.runner} runs the job outside its launcher; "
                       + (f"ask it: {owner.check_command.replace('JOB_ID', str(owner.job_id))}"
                          if owner.check_command and owner.job_id else "ask the runner whether it still runs"))
    if owner.host == socket.gethostname():
        if not process_alive(owner.pid, owner.process_start):
            return True, f"its launcher (process {owner.pid} on {owner.host}) is gone, and the job with it"
        return False, f"its launcher, process {owner.pid} on {owner.host}, still runs"
    running = _slurm_attempt_running(owner.slurm_job, owner.slurm_restarts) if owner.slurm_job else None
    if running is False:
        return True, (f"its launcher ran on {owner.host} in SLURM job {owner.slurm_job}, which has ended or been "
                      "requeued since, and the job with it")
    if running:
        return False, f"its launcher runs on {owner.host} in SLURM job {owner.slurm_job}"
    return False, f"its launcher ran on {owner.host}: check there that process {owner.pid} is gone"


def _slurm_attempt_running(job_id: str, restarts: int) -> bool | None:
    """Whether the attempt `restarts` of SLURM job `job_id` still runs; None where SLURM cannot be asked."""
    try:
        shown = subprocess.run(["scontrol", "--oneliner", "show", "job", job_id], capture_output=True, text=True,
                               timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if shown.returncode != 0:   # a job that left slurmctld (MinJobAge after its end) is unknown to it
        return False if "Invalid job id" in shown.stderr else None
    fields = dict(item.split("=", 1) for item in shown.stdout.split() if "=" in item)
    if int(fields.get("Restarts", "0")) != restarts:
        return False            # requeued since: SLURM ended that attempt's processes
    return fields.get("JobState") in _SLURM_ACTIVE


def check_leftover_spill(output_dir: str) -> str | None:
    """Before a run of `output_dir` touches anything: an earlier run's spill is removed when its job has ended
    (returns what was removed and why), and refused when a job may still read it (SpillInUse). None: no spill."""
    files = spill_files(output_dir)
    if not files:
        return None
    owner = read_owner(output_dir)
    where = f"{spill_dir(output_dir)} ({_size_text(files)})"
    if owner is None:
        raise SpillInUse(f"{where} holds an earlier run's spill that names no job (written by a data_prep before "
                         f"jobs were recorded): a job of that run may still read it. {_removal_hint(output_dir)}")
    ended, why = job_has_ended(owner)
    if not ended:
        raise SpillInUse(f"{where} is the spill of {owner.describe()}, which may still run ({why}); this run would "
                         f"overwrite its files and shards. {_removal_hint(output_dir)}")
    remove_spill(output_dir)
    return f"removed the spill of an earlier run, {where}: {owner.describe()}; {why}"


def _removal_hint(output_dir: str) -> str:
    return ("Once that job has finished, failed or been cancelled, remove the spill with "
            f"`python -m data_prep.spill_owner {output_dir} --remove` and run again.")


def _size_text(files: list[str]) -> str:
    sizes = FileSystems.match(files)
    return (f"{len(files)} file{'s' if len(files) != 1 else ''}, "
            f"{sum(m.size_in_bytes for r in sizes for m in r.metadata_list) / 1e6:,.1f} MB")


def record_job(output_dir: str, owner: SpillOwner, result) -> SpillOwner:
    """The owner with the submitted job's id, recorded in the spill (the runners name it differently)."""
    job_id = getattr(result, "job_id", None)
    job_id = job_id() if callable(job_id) else job_id   # Dataflow: a method; the portable runners: _job_id
    job_id = job_id or getattr(result, "_job_id", None)
    if not job_id:
        return owner
    owner = dataclasses.replace(owner, job_id=str(job_id))
    write_owner(output_dir, owner)
    return owner


def settle_spill(output_dir: str, owner: SpillOwner, result, error: BaseException | None) -> None:
    """After the launcher stopped waiting: the spill goes when the job has ended, and stays (said loudly) otherwise."""
    if result is None:
        # pipeline.run() raised. An Exception: the submission failed, or a job in the launcher failed inside run().
        # Ctrl-C during a remote submission may have left a job behind.
        ended, state = isinstance(error, Exception) or owner.in_launcher, "perhaps submitted (submission interrupted)"
    else:
        try:
            state = result.state
        except Exception as failure:   # noqa: BLE001 - the runner cannot be asked; the job may still run
            state = f"{PipelineState.UNKNOWN} ({type(failure).__name__}: {failure})"
        ended = state in ENDED_STATES
    if ended:
        remove_spill(output_dir)
        return
    log.warning("the spill %s stays: %s is %s, not finished, failed or cancelled, and reads it until it ends. %s "
                "(A later run of this output removes it by itself where it can tell that the job has ended.)",
                spill_dir(output_dir), owner.describe(), state, _removal_hint(output_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data_prep.spill_owner", description=__doc__.split("\n\n")[0])
    parser.add_argument("output_dir")
    parser.add_argument("--remove", action="store_true", help="remove the spill (its job has ended)")
    args = parser.parse_args(argv)
    files = spill_files(args.output_dir)
    if not files:
        print(f"no spill in {args.output_dir}")
        return 0
    owner = read_owner(args.output_dir)
    ended, why = job_has_ended(owner) if owner else (False, "no job recorded")
    print(f"{spill_dir(args.output_dir)}: {_size_text(files)}; "
          f"{owner.describe() if owner else 'written by a data_prep that recorded no job'}; "
          f"{'ended' if ended else 'may still run'}: {why}")
    if args.remove:
        if owner is not None and owner.in_launcher and owner.host == socket.gethostname() and not ended:
            print(f"not removed: its launcher, process {owner.pid}, still runs; stop it first", file=sys.stderr)
            return 1
        remove_spill(args.output_dir)
        print("removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
