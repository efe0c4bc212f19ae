"""Run one stage of a written plan: the marker says running, the entry point runs, the marker says done or failed.

    python -m pipeline.orchestration.stage_job --plan=<root>/_workflow/plan.json --stage=NAME [--log=PATH]

The local launcher calls `run_stage` for each stage; a SLURM job runs this module (under SLURM, pre-training and
fine-tuning go through `srun`, one task per GPU, as infra/slurm/train.sbatch does). A pre-training stage whose run
directory holds checkpoints of the same config and inputs (an interrupted run, a SLURM requeue) resumes from the
newest one (`ckpt_path=last`); checkpoints of another config are removed first, so they are never resumed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from pipeline.core.checkpoint_files import newest_complete_checkpoint
from pipeline.orchestration import markers
from pipeline.orchestration.plan import StagePlan, consumed_inputs, read_plan
from pipeline.core.app import REPO_ROOT
from pipeline.orchestration.spec import STATE_DIR
from pipeline.orchestration.wandb_links import wandb_links


def slurm_job_id() -> str | None:
    """The id squeue shows for this job: <array job>_<task> for an array task."""
    if os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def prepare_training_dir(plan: StagePlan, inputs_consumed: dict, say) -> list[str]:
    """Extra overrides for a pre-training stage: ckpt_path=last when its run directory holds checkpoints of this
    very config and inputs; otherwise the directory is emptied (another config's checkpoints must not be resumed)."""
    run_dir = Path(plan.output_dir)
    attempt_file = run_dir / markers.ATTEMPT_FILE
    attempt = None
    if attempt_file.is_file():
        try:
            attempt = json.loads(attempt_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            attempt = None
    same = bool(attempt and attempt.get("config_hash") == plan.config_hash
                and attempt.get("inputs_consumed") == inputs_consumed)
    extra: list[str] = []
    if same and newest_complete_checkpoint(run_dir / "checkpoints", run_dir) is not None:
        say(f"resuming {plan.name} from the newest checkpoint in {run_dir} (same config and inputs)")
        extra.append("ckpt_path=last")
    elif run_dir.exists() and any(run_dir.iterdir()):
        say(f"{run_dir} holds a run of another config or inputs: removed, {plan.name} starts afresh")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    markers.write_json_atomically(attempt_file, {"config_hash": plan.config_hash, "inputs_consumed": inputs_consumed,
                                                 "started_at": markers.now()})
    return extra


def run_stage(plan_path: Path, stage_name: str, log_path: Path | None = None, under_slurm: bool | None = None,
              recorded_log: Path | None = None) -> int:
    """Run the stage; returns its exit status. log_path: the file the entry point's output is appended to (None:
    inherited, as in a SLURM job, whose output file is the log: pass that as recorded_log for the markers)."""
    record, plans = read_plan(plan_path)
    plan = plans[stage_name]
    state_dir = Path(record["root"]) / STATE_DIR
    under_slurm = bool(os.environ.get("SLURM_JOB_ID")) if under_slurm is None else under_slurm
    job_id = slurm_job_id() if under_slurm else None
    log_shown = str(log_path or recorded_log) if (log_path or recorded_log) else None
    common = {"config_hash": plan.config_hash, "log": log_shown, "job_id": job_id}

    def say(message: str) -> None:
        line = f"[workflow {record['workflow']}] {message}"
        if log_path is not None:
            with open(log_path, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")
        else:
            print(line, flush=True)

    inputs = consumed_inputs(state_dir, plan) if not plan.is_report else {}
    missing = [up for up, run_id in inputs.items() if run_id is None]
    if missing:
        markers.write_marker(state_dir, stage_name, markers.FAILED, exit_code=None, **common,
                             reason=f"input stage {', '.join(missing)} is not done")
        say(f"{stage_name}: input stage {', '.join(missing)} is not done; not started")
        return 2

    argv = list(plan.argv)
    resumed = False
    if plan.entry == "train":
        extra = prepare_training_dir(plan, inputs, say)
        resumed = bool(extra)
        argv += extra
    else:
        for name in plan.complete_when:     # this run's completion must not be read from a previous run's files
            Path(plan.output_dir, name).unlink(missing_ok=True)
    if under_slurm and plan.parallel_ranks:
        argv = ["srun", "--kill-on-bad-exit=1", *argv]

    started_at, started = markers.now(), time.perf_counter()
    markers.write_marker(state_dir, stage_name, markers.RUNNING, **common, inputs_consumed=inputs,
                         started_at=started_at, host=socket.gethostname(), pid=os.getpid(), resumed=resumed)
    env = {**os.environ, **plan.env, "PYTHONPATH": os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    say(f"{stage_name}: {' '.join(argv)}")
    log_handle = open(log_path, "ab") if log_path is not None else None
    try:
        child = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=log_handle or None,
                                 stderr=subprocess.STDOUT if log_handle else None)
    except OSError as error:
        markers.write_marker(state_dir, stage_name, markers.FAILED, exit_code=None, **common,
                             reason=f"could not start {argv[0]}: {error}")
        return 127

    interrupted: list[int] = []

    def forward(signum, _frame):
        # SLURM's requeue and time limit, or Ctrl-C: stop the entry point and say so in the marker (not failed:
        # a requeued job comes back and resumes).
        interrupted.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        exit_code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if log_handle:
            log_handle.close()
    seconds = round(time.perf_counter() - started, 2)
    outcome = {**common, "inputs_consumed": inputs, "started_at": started_at, "wall_seconds": seconds,
               "resumed": resumed}
    complete = markers.outputs_complete(Path(plan.output_dir), plan.complete_when)
    if exit_code == 0 and complete:
        markers.write_marker(state_dir, stage_name, markers.DONE, **outcome, run_id=markers.new_run_id(),
                             finished_at=markers.now(), wandb=wandb_links(Path(plan.output_dir), log_path or recorded_log))
        say(f"{stage_name}: done in {seconds:.1f} s")
        return 0
    if interrupted:
        markers.write_marker(state_dir, stage_name, markers.INTERRUPTED, **outcome,
                             reason=f"signal {signal.Signals(interrupted[0]).name}")
        say(f"{stage_name}: interrupted by {signal.Signals(interrupted[0]).name} after {seconds:.1f} s")
        return exit_code or 1
    reason = (f"exit status {exit_code}" if exit_code else
              f"exited 0 but left no {', '.join(plan.complete_when)} in {plan.output_dir}")
    markers.write_marker(state_dir, stage_name, markers.FAILED, exit_code=exit_code, reason=reason, **outcome)
    say(f"{stage_name}: failed ({reason}) after {seconds:.1f} s")
    return exit_code or 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", required=True, type=Path)
    parser.add_argument("--stage", required=True)
    parser.add_argument("--log", type=Path, default=None,
                        help="the log file the job writes to (recorded in the marker; output is not redirected)")
    args = parser.parse_args(argv)
    if os.environ.get("SLURM_JOB_ID"):
        # In a SLURM job the job's output file already is the log: name it in the markers, leave stdout alone.
        return run_stage(args.plan, args.stage, None, under_slurm=True, recorded_log=args.log)
    return run_stage(args.plan, args.stage, args.log)


if __name__ == "__main__":
    sys.exit(main())
