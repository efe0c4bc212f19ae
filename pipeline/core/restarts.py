"""Start a failed try of a pre-training again from its newest complete checkpoint, a bounded number of times, and stop
a crash loop. Plain file checks and a child process: nothing heavy is imported.

SLURM requeues a job after a node failure or a preemption, and the ranks requeue it themselves at the time limit
(pipeline/core/requeue.py), but nothing requeues a job that FAILED: an NCCL timeout, a GPU error, a rank killed by
the OOM killer would end a run of weeks until someone notices. So the training command runs here, and when a try
ends, by its exit status:

- 0: the run finished; REQUEUED_EXIT_CODE (75): the job was requeued, its next start resumes. Either ends here.
- stopped by SIGINT or SIGTERM (Ctrl-C, `kill`, `scancel`: killed by it, or the shell's 128 + its number, which
  pipeline/train.py exits with when it stops on one): somebody stopped it on purpose. That ends here too.
- anything else, the try failed. When the run's newest complete checkpoint (checkpoint_files.py) is newer than at the
  try's start, the try got somewhere: the command runs again, resuming from that checkpoint (its `ckpt_path=...`
  becomes `ckpt_path=auto`), at most MAX_RESTARTS times (default 3) per start of the job. When it is not, the try
  failed before its first new checkpoint: whatever stopped it (a bad config, a corrupt file, a broken node) would
  stop the next one at the same point, a crash loop. The run stops, saying so, with the try's exit status.

Each decision is one line in the log. Used by infra/slurm/train.sbatch (the command line below, which also passes a
requeue signal sent to the batch shell on to the running try) and by the workflow's pre-training stages
(pipeline/orchestration/stage_runner.py, with the stage's environment's MAX_RESTARTS):

    python -m pipeline.core.restarts <run dir> -- <training command ...>
"""
from __future__ import annotations

import datetime
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.core.checkpoint_files import CHECKPOINT_DIR, newest_complete_checkpoint, written_at

# The exit status of a training whose job was requeued (sysexits' EX_TEMPFAIL: try again later). Not 0, so that
# nothing that runs the training (the workflow's stage runner, a shell script) takes the phase as finished.
REQUEUED_EXIT_CODE = 75
MAX_RESTARTS_VARIABLE, DEFAULT_MAX_RESTARTS = "MAX_RESTARTS", 3
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)   # a try ended by one of these was stopped, not failed
FORWARDED_SIGNALS = (signal.SIGUSR1,)    # pipeline/core/requeue_safe_loader.REQUEUE_SIGNAL, without importing torch


def max_restarts(env: Mapping[str, str] = os.environ) -> int:
    """MAX_RESTARTS from the environment (default 3); 0: a failed try is never started again."""
    value = env.get(MAX_RESTARTS_VARIABLE, "").strip()
    if not value:
        return DEFAULT_MAX_RESTARTS
    if not value.isdigit():
        raise ValueError(f"{MAX_RESTARTS_VARIABLE} must be a whole number >= 0 (how often a failed try of a training "
                         f"is started again), got {value!r}")
    return int(value)


def newest_checkpoint(run_dir: Path) -> tuple[str, int] | None:
    """(path, when it was completed) of the run's newest complete checkpoint; None when it has none."""
    newest = newest_complete_checkpoint(Path(run_dir) / CHECKPOINT_DIR, Path(run_dir))
    return None if newest is None else (str(newest), written_at(newest))


def resume_argv(argv: Sequence[str]) -> list[str]:
    """The command again, resuming from the run's newest complete checkpoint."""
    kept = [arg for arg in argv if not arg.startswith("ckpt_path=")]
    return [*kept, "ckpt_path=auto"]


def decide(attempt: int, exit_code: int, before: tuple[str, int] | None, after: tuple[str, int] | None,
           restarts_done: int, restarts_allowed: int) -> tuple[bool, str | None]:
    """(start it again?, what to say) after try `attempt` (1, 2 ...) ended with `exit_code`; before/after: the run's
    newest complete checkpoint at the try's start and end."""
    if exit_code in (0, REQUEUED_EXIT_CODE):
        return False, None
    if stopped_by(exit_code) is not None:
        return False, f"try {attempt} was stopped ({stopped_by(exit_code).name}): not started again"
    failed = f"try {attempt} failed ({_status(exit_code)})"
    if after is None or (before is not None and after[1] <= before[1]):
        newest = f"still {before[0]}" if before else "none yet"
        resume = (f"Submitted again with the same run directory, it resumes from {before[0]}" if before
                  else "Submitted again, it starts from the beginning")
        return False, (f"{failed} before writing a new checkpoint (the run's newest complete checkpoint: {newest}): "
                       f"the next try would fail the same way (a crash loop), so the run stops here. Look for the "
                       f"cause above. {resume}.")
    if restarts_done >= restarts_allowed:
        return False, (f"{failed} after writing {after[0]}, but the restarts allowed are spent "
                       f"({MAX_RESTARTS_VARIABLE}={restarts_allowed}): the run stops here. Submitted again with the "
                       f"same run directory, it resumes from {after[0]}.")
    return True, (f"{failed} after writing {after[0]}: starting try {attempt + 1} from it (restart "
                  f"{restarts_done + 1} of at most {restarts_allowed}, {MAX_RESTARTS_VARIABLE})")


def stopped_by(exit_code: int) -> signal.Signals | None:
    """The stop signal (STOP_SIGNALS) that ended a process with `exit_code` (Popen's -N, or a shell's 128 + N)."""
    for signum in STOP_SIGNALS:
        if exit_code in (-signum, 128 + signum):
            return signum
    return None


def _status(exit_code: int) -> str:
    if exit_code < 0:
        return f"killed by {signal.Signals(-exit_code).name}" if -exit_code in signal.valid_signals() \
            else f"killed by signal {-exit_code}"
    return f"exit status {exit_code}"


def run_with_restarts(argv: Sequence[str], run_dir: Path, restarts_allowed: int, say: Callable[[str], None],
                      forward: Sequence[signal.Signals] = (), **popen: Any) -> tuple[int, list[dict]]:
    """Runs `argv` (subprocess.Popen with `popen`), again after a failed try while decide() says so; returns the last
    try's exit status and a record of every try. forward: signals this process passes on to the running try."""
    tries: list[dict] = []
    running: list[subprocess.Popen] = []

    def pass_on(signum: int, frame: Any) -> None:
        for child in running:
            child.send_signal(signum)

    previous = {signum: signal.signal(signum, pass_on) for signum in forward}
    try:
        while True:
            before = newest_checkpoint(run_dir)
            started = time.monotonic()
            child = subprocess.Popen(list(argv), **popen)
            running.append(child)
            exit_code = child.wait()
            running.clear()
            try:
                after = newest_checkpoint(run_dir)
            except OSError as error:    # e.g. a checkpoint it may not read (checkpoint_files.UnreadableCheckpoint)
                say(f"try {len(tries) + 1} failed ({_status(exit_code)}), and whether it wrote a new checkpoint "
                    f"cannot be told ({error}): the run stops here")
                after = before
                restart, message = False, None
            else:
                restart, message = decide(len(tries) + 1, exit_code, before, after, len(tries), restarts_allowed)
            tries.append({"exit": exit_code, "seconds": round(time.monotonic() - started, 1),
                          "resumed_from": before[0] if before else None,
                          "newest_checkpoint": after[0] if after else None})
            if message:
                say(message)
            if not restart:
                return exit_code, tries
            argv = resume_argv(argv)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--":
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    try:
        allowed = max_restarts()
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2

    def say(message: str) -> None:
        print(f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')} {message}", flush=True)

    exit_code, _ = run_with_restarts(args[2:], Path(args[0]), allowed, say, forward=FORWARDED_SIGNALS)
    # A try killed by a signal: a shell's way of saying so (128 + the signal), which SLURM records as is
    return exit_code if exit_code >= 0 else 128 - exit_code


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(message)s")   # checkpoint_files says what it passed over
    sys.exit(main())
