"""Start a failed try of a pre-training again from its newest complete checkpoint, a bounded number of times, and stop
a crash loop. Plain file checks and a child process: nothing heavy is imported.

SLURM requeues a job after a node failure or a preemption, and the ranks requeue it themselves at the time limit
(pipeline/core/cluster/requeue.py), but nothing requeues a job that FAILED: an NCCL timeout, a GPU error, a rank killed
by the OOM killer would end a run of weeks until someone notices. So the training command runs here, and when a try
ends, by its exit status:

- 0: the run finished; REQUEUED_EXIT_CODE (75): the job was requeued, its next start resumes. Either ends here.
- stopped by SIGINT or SIGTERM (Ctrl-C, `kill`, `scancel`: killed by it, or the shell's 128 + its number, which
  pipeline/train.py exits with when it stops on one): somebody stopped it on purpose. That ends here too.
- REFUSED_EXIT_CODE (2): the training refused to start (its config, its run directory, its files; it said why). The
  same refusal would come again: that ends here too.
- anything else, the try failed. When the run's newest complete checkpoint (checkpoint_files.py) is newer than at the
  try's start, the try got somewhere: the command runs again, resuming from that checkpoint (its `ckpt_path=...`
  becomes `ckpt_path=auto`), at most MAX_RESTARTS times (default 3) per start of the job. When it is not, the try
  failed before its first new checkpoint: whatever stopped it (a bad config, a corrupt file, a broken node) would
  stop the next one at the same point, a crash loop. The run stops, saying so, with the try's exit status.

A stop sent to this process (SIGINT, SIGTERM: Ctrl-C, `kill`, `scancel --batch`) is passed on to the running try,
which stops as it would on its own (pipeline/train.py: exit 130 or 143, its run directory's lock released); this
process waits for it, starts no other try, and exits with its status. A try never outlives this process: on Linux it
gets SIGTERM from the kernel when this process ends, also by a SIGKILL, which nothing can catch (see
with_parent_death_signal). A run whose newest checkpoint cannot be told (one this user may not read) is not started:
the training would refuse it the same way.

Each decision is one line in the log. Used by infra/slurm/train.sbatch (the command line below, which also passes a
requeue signal sent to the batch shell on to the running try) and by the workflow's pre-training stages
(pipeline/orchestration/stage_runner.py, with the stage's environment's MAX_RESTARTS):

    python -m pipeline.core.cluster.restarts <run dir> -- <training command ...>
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

from pipeline.core.checkpoints.checkpoint_files import CHECKPOINT_DIR, newest_complete_checkpoint, written_at

# The exit status of a training whose job was requeued (sysexits' EX_TEMPFAIL: try again later). Not 0, so that
# nothing that runs the training (the workflow's stage runner, a shell script) takes the phase as finished.
REQUEUED_EXIT_CODE = 75
# The exit status of a training refused before it started, for a reason its message gives (a config that changes what
# shapes a resumed run, a run directory in use or not writable, a checkpoint it may not read): 2, as for a command's
# wrong usage. Starting it again would meet the same refusal.
REFUSED_EXIT_CODE = 2
MAX_RESTARTS_VARIABLE, DEFAULT_MAX_RESTARTS = "MAX_RESTARTS", 3
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)   # a try ended by one of these was stopped, not failed
FORWARDED_SIGNALS = (signal.SIGUSR1,)    # pipeline/core/requeue_safe_loader.REQUEUE_SIGNAL, without importing torch

# How a try learns that this process ended: run by `python -I -S -c` (no site, no PYTHONPATH: nothing but the standard
# library, ~0.07 s) between this process and the command, it asks the kernel for SIGTERM when its parent ends
# (prctl PR_SET_PDEATHSIG, which outlives exec), then becomes the command (exec: same pid, same environment, the
# signal dispositions Popen would give it).
_BECOME_WITH_PARENT_DEATH_SIGNAL = """
import ctypes, os, signal, sys
parent, argv = int(sys.argv[1]), sys.argv[2:]
PR_SET_PDEATHSIG = 1
if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
    print(f"warning: {argv[0]} will go on if its supervisor is killed (prctl: {os.strerror(ctypes.get_errno())})",
          file=sys.stderr, flush=True)
elif os.getppid() != parent:    # the supervisor ended before the request: no signal would come
    sys.exit(128 + signal.SIGTERM)
for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):    # ignored by Python at its start, not by the command
    if hasattr(signal, name):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
try:
    os.execvp(argv[0], argv)
except OSError as error:
    print(f"{argv[0]}: {error.strerror}", file=sys.stderr)
    sys.exit(127 if isinstance(error, FileNotFoundError) else 126)    # a shell's statuses for these
"""


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
    if exit_code == REFUSED_EXIT_CODE:
        return False, f"try {attempt} refused to start (exit status {exit_code}, the reason above): not started again"
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


def with_parent_death_signal(argv: Sequence[str]) -> list[str]:
    """`argv` as a command that gets SIGTERM when this process ends, however it ends (Linux; elsewhere `argv`).

    A SIGKILL of this process (the OOM killer, `kill -9`, a container stopped) cannot be caught, so nothing here could
    pass a stop on: without this, the try would go on training, orphaned, holding its run directory's lock. With it,
    the try stops as on any SIGTERM (pipeline/train.py: at its next step, exit 143, the lock released).

    Why this way: preexec_fn (prctl between fork and exec) may deadlock the child where the caller has threads, and
    the workflow's stage runner runs inside Snakemake's thread pool. A new session or process group is not needed,
    and would take the try out of the terminal's Ctrl-C. The kernel sends the signal when the *thread* that started
    the child ends, not the process: run_with_restarts waits for each try in the thread that started it, so the two
    end together."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", _BECOME_WITH_PARENT_DEATH_SIGNAL, str(os.getpid()), *argv]


def run_with_restarts(argv: Sequence[str], run_dir: Path, restarts_allowed: int, say: Callable[[str], None],
                      forward: Sequence[signal.Signals] = (), **popen: Any) -> tuple[int, list[dict]]:
    """Runs `argv` (subprocess.Popen with `popen`), again after a failed try while decide() says so; returns the last
    try's exit status and a record of every try. forward: signals this process passes on to the running try (only a
    main thread may handle signals); a stop signal among them (STOP_SIGNALS) also ends the run: no try starts after
    it."""
    tries: list[dict] = []
    running: list[subprocess.Popen] = []
    stops: list[signal.Signals] = []

    # A Ctrl-C in a terminal reaches the try too (one process group): it then gets SIGINT twice, which
    # pipeline/train.py takes as one stop (and srun's "twice within a second" as the stop of its tasks).
    def pass_on(signum: int, frame: Any) -> None:
        if signum in STOP_SIGNALS:
            stops.append(signal.Signals(signum))
        for child in running:
            child.send_signal(signum)

    previous = {signum: signal.signal(signum, pass_on) for signum in forward}
    try:
        while True:
            attempt = len(tries) + 1
            try:
                before = newest_checkpoint(run_dir)
            except OSError as error:    # e.g. checkpoint_files.UnreadableCheckpoint: the training would refuse too
                say(f"try {attempt} not started: {error}")
                return REFUSED_EXIT_CODE, tries
            if stops:
                say(f"stopped ({stops[0].name}) before try {attempt}: not started")
                return 128 + stops[0], tries
            started = time.monotonic()
            child = subprocess.Popen(with_parent_death_signal(argv), **popen)
            running.append(child)
            if stops:       # it came while the try was being started (it may then get it twice: taken as once)
                child.send_signal(stops[0])
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
                restart, message = decide(attempt, exit_code, before, after, len(tries), restarts_allowed)
            if stops and exit_code not in (0, REQUEUED_EXIT_CODE):     # stopped on purpose, whatever else it says
                restart, message = False, (f"try {attempt} was stopped ({stops[0].name}, passed on from this "
                                           f"supervisor; it ended with {_status(exit_code)}): not started again")
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

    exit_code, _ = run_with_restarts(args[2:], Path(args[0]), allowed, say,
                                     forward=(*FORWARDED_SIGNALS, *STOP_SIGNALS))
    # A try killed by a signal: a shell's way of saying so (128 + the signal), which SLURM records as is
    return exit_code if exit_code >= 0 else 128 - exit_code


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(message)s")   # checkpoint_files says what it passed over
    sys.exit(main())
