"""Requeue a SLURM job with a checkpoint before its time limit or at a preemption: the signal only asks for it.

Lightning's own auto-requeue (on by default under SLURM) saves the checkpoint inside its SIGUSR1 handler. That save
makes collective calls (the per-rank RNG gather, DeepSpeed's sharded save, barriers), which each rank enters from
wherever the signal interrupted it, possibly with gradient communication in flight: they can mismatch and hang until
the NCCL timeout (Lightning issue #21406). Forked DataLoader workers inherit that handler, so a signal to every
process of the job step (`scancel --signal=USR1 <job>`, `--signal=USR1@N` without `B:`) runs W&B's finish and a save
in each worker, which dies. So the pipeline turns it off (`cluster_plugins`: SLURMEnvironment(auto_requeue=False))
and does this instead:

1. `RequeueRequest`: the SIGUSR1 handler sets a flag in the rank's main process, and ignores the signal in any other
   process (a forked loader worker inherits the handler, with another pid). Loader workers that are not forked
   (`spawn`, `forkserver`) would die of it: the loaders set it aside in every worker first thing
   (pipeline/core/cluster/requeue_safe_loader.py).
2. `RequeueOnSignal`, a callback, at every optimizer-step boundary: the ranks agree on the flag with one all-reduce
   of one number (over gloo, on the CPU: no GPU synchronisation). When any rank got the signal, every rank saves
   checkpoints/last.ckpt at the same point of the same step, outside any signal handler; once Lightning has logged
   that step, and once every rank ignores the SIGTERM that a requeue makes SLURM send, rank 0 marks the W&B run
   preempted and finishes it, then runs `scontrol requeue <job>` (its return code checked), while the other ranks
   wait for the outcome (so that none exits, and srun's --kill-on-bad-exit stops rank 0, before the requeue). That
   SIGTERM also kills the ranks' loader workers, whose deaths torch's SIGCHLD handler would raise in the ranks: they
   no longer watch them (no batch is fetched after the save). The fit then stops on every rank with
   `RequeueRequested`, and the processes exit with REQUEUED_EXIT_CODE (pipeline/pretraining/run.py,
   pipeline/train.py). The job's next start resumes from the newest complete checkpoint (train.sbatch passes
   ckpt_path=auto), into the same W&B run.

The order of step 2 is forced: the requeue makes SLURM send SIGTERM to every process of the job at once, W&B's
service among them, which then loses whatever it has not written yet (an offline run's file kept none of the steps
logged just before). But W&B may hang (a server that does not answer), and the requeue must happen within the
signal's lead: W&B gets at most REQUEUE_WANDB_TIMEOUT_S (environment, default 30 s), then the requeue goes ahead
and the W&B run lacks its last steps (the CSV log has them); `scontrol` gets at most 30 s. So the lead must cover a
step, the save, that wait and `scontrol`: 120 s for BERT-Large on a fast file system, more on a slow one.

Across nodes gloo needs an address the other nodes reach: each rank checks its own before the agreement group is
made (pipeline/core/cluster/gloo_address.py) and stops, saying what to set, rather than hang at the first step.
"""
from __future__ import annotations

import datetime
import logging
import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from lightning_fabric.plugins.environments import SLURMEnvironment
from pytorch_lightning.callbacks import Checkpoint

from pipeline.core.cluster.gloo_address import checked_gloo_group
from pipeline.core.cluster.requeue_safe_loader import REQUEUE_SIGNAL  # defined there: the loader workers import it
from pipeline.core.cluster.restarts import REQUEUED_EXIT_CODE  # defined there: train.sbatch's supervisor reads it
from pipeline.core.run.loggers import finish_wandb

WANDB_TIMEOUT_VARIABLE, DEFAULT_WANDB_TIMEOUT_S = "REQUEUE_WANDB_TIMEOUT_S", 30.0
SCONTROL_TIMEOUT_S = 30
log = logging.getLogger(__name__)


class RequeueRequested(Exception):
    """Raised on every rank once the requeue checkpoint is saved: the fit ends here. `job`: the job id requeued, or
    None with `error` saying why the requeue failed (the checkpoint is saved all the same)."""

    def __init__(self, checkpoint: Path, global_step: int, job: str | None, error: str | None):
        outcome = f"job {job} requeued" if job else f"the requeue failed: {error}"
        super().__init__(f"{REQUEUE_SIGNAL.name}: saved {checkpoint} at step {global_step}; {outcome}")
        self.checkpoint, self.global_step, self.job, self.error = checkpoint, global_step, job, error


class RequeueRequest:
    """The SIGUSR1 handler of one process, as a context: within it, the signal sets `received` in this process and
    is ignored in any other (loader workers forked meanwhile inherit the handler); on leaving, the previous handler is
    back."""

    def __init__(self, signum: signal.Signals = REQUEUE_SIGNAL):
        self.signum, self.received = signum, False
        self._owner: int | None = None
        self._previous: Any = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Nothing else happens here: no I/O, no locks, no collective calls (see the module docstring).
        if os.getpid() == self._owner:
            self.received = True

    def __enter__(self) -> RequeueRequest:
        self._owner = os.getpid()
        self._previous = signal.signal(self.signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        signal.signal(self.signum, self._previous if self._previous is not None else signal.SIG_DFL)


class RequeueOnSignal(Checkpoint):
    """At the first optimizer-step boundary after any rank received the requeue signal, saves checkpoints/last.ckpt
    (every rank). Once Lightning has logged that step, finishes W&B marked preempted and requeues the job (rank 0;
    the others wait for the outcome), and stops the fit with RequeueRequested. A Checkpoint callback, so Lightning
    runs it after ModelCheckpoint: a periodic checkpoint due at the same step is written first, and last.ckpt is not
    written twice."""

    def __init__(self, request: RequeueRequest, checkpoint_dir: Path):
        self.request, self.checkpoint_dir = request, Path(checkpoint_dir)
        self._group: Any = None
        self._wandb_timeout_s = DEFAULT_WANDB_TIMEOUT_S
        self._step_seen = 0
        self._saved: tuple[Path, int] | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._wandb_timeout_s = wandb_timeout_s()     # a wrong value stops the run now, not at the requeue
        if _distributed():
            self._group = agreement_group(trainer.num_nodes)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._step_seen = trainer.global_step     # where this fit starts (a resumed one: the checkpoint's step)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if trainer.global_step == self._step_seen:
            return   # within a gradient accumulation: not a step boundary
        self._step_seen = trainer.global_step
        if not self._any_rank_received() or trainer.global_step >= trainer.max_steps > 0:
            return   # the last step: the run finishes (final checkpoint, export) instead
        checkpoint = self.checkpoint_dir / "last.ckpt"
        model_checkpoint = trainer.checkpoint_callback
        saved_here = getattr(model_checkpoint, "_last_global_step_saved", None) == trainer.global_step
        if not (saved_here and model_checkpoint.save_last and checkpoint.exists()):
            trainer.save_checkpoint(str(checkpoint))   # every rank: collective under DeepSpeed
        self._saved = (checkpoint, trainer.global_step)

    # Lightning writes a step's metrics to the loggers after on_train_batch_end: the requeue waits for that, until
    # the next batch (or the end of the fit), so that W&B's run and the CSV log hold the step the checkpoint holds.
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._saved is not None:
            self._requeue(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._saved is not None:
            self._requeue(trainer)

    def _requeue(self, trainer: pl.Trainer) -> None:
        checkpoint, step = self._saved
        self._saved = None
        # The requeue makes SLURM send SIGTERM to every process at once. This one stops by itself now: without this,
        # Lightning's SIGTERM handler would start a broadcast on the training group from wherever it interrupts
        # (rank 0 in `scontrol`, the others waiting for its outcome) and wait there until SLURM's SIGKILL.
        # Its loader workers die of that SIGTERM (torch's worker handler exits quietly only when the signal comes from
        # the worker's parent), and torch's SIGCHLD handler would raise "DataLoader worker ... is killed by signal" in
        # this process wherever it is (waiting for rank 0's outcome, shutting the loaders down): the rank would exit 1,
        # not REQUEUED_EXIT_CODE. No batch is fetched after this point, so that check has nothing left to guard.
        # Both hold until the process exits: the fit's teardown would restore the handlers of before the fit.
        originals = getattr(getattr(trainer, "_signal_connector", None), "_original_handlers", None)
        for signum, handler in ((signal.SIGTERM, signal.SIG_IGN), (signal.SIGCHLD, signal.SIG_DFL)):
            signal.signal(signum, handler)
            if isinstance(originals, dict):
                originals[signum] = handler
        if _distributed():
            # Every rank ignores SIGTERM before rank 0 requeues: a rank still waiting for its next batch would take it
            # in Lightning's handler and hang there until SLURM's SIGKILL (KillWait later), its exit status lost.
            dist.barrier(group=self._group)
        outcome: tuple[str | None, str | None] = (None, None)
        if trainer.is_global_zero:
            finish_wandb_within(trainer.loggers, self._wandb_timeout_s)
            try:
                outcome = (requeue_slurm_job(), None)
            except RuntimeError as error:
                outcome = (None, str(error))
        job, error = self._from_rank_zero(outcome)
        raise RequeueRequested(checkpoint, step, job, error)

    def _any_rank_received(self) -> bool:
        flag = torch.tensor([1 if self.request.received else 0], dtype=torch.int32)
        if _distributed():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return bool(flag.item())

    def _from_rank_zero(self, outcome: tuple[str | None, str | None]) -> tuple[str | None, str | None]:
        if not _distributed():
            return outcome
        shared = [outcome]
        dist.broadcast_object_list(shared, src=0, group=self._group)
        return shared[0]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def agreement_group(num_nodes: int, timeout: datetime.timedelta | None = None) -> Any:
    """The requeue's own process group, over gloo (every rank calls this): the agreement runs on the CPU (no GPU
    synchronisation where training runs NCCL), and never pairs with another collective on the training group. Across
    nodes, refuses an address the other nodes cannot reach (gloo_address.py) instead of hanging at the first step.
    infra/slurm/smoke_ddp.py makes it too."""
    return checked_gloo_group(num_nodes, timeout)


def wandb_timeout_s() -> float:
    """How long rank 0 waits for W&B before the requeue: REQUEUE_WANDB_TIMEOUT_S, default 30 s."""
    value = os.environ.get(WANDB_TIMEOUT_VARIABLE, "").strip()
    try:
        seconds = float(value) if value else DEFAULT_WANDB_TIMEOUT_S
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"{WANDB_TIMEOUT_VARIABLE} must be a number of seconds >= 0, got {value!r}")
    return seconds


def finish_wandb_within(loggers: list, timeout_s: float) -> bool:
    """Finish the W&B run marked preempted, waiting at most timeout_s; False when it did not finish in time (it is
    left to itself: the requeue's SIGTERM ends W&B's service). Whatever W&B raises is logged, never raised: the
    requeue goes ahead."""
    def finish() -> None:
        try:
            finish_wandb(loggers, preempted_exit_code=REQUEUED_EXIT_CODE)
        except Exception as error:   # noqa: BLE001 (any failure of W&B's: the requeue must not wait for it)
            log.warning("W&B could not finish the run before the requeue: %s", error)

    finishing = threading.Thread(target=finish, name="wandb-finish", daemon=True)
    finishing.start()
    finishing.join(timeout_s)
    if finishing.is_alive():
        log.warning("W&B did not finish the run within %g s (%s): requeueing without it; the W&B run lacks the last "
                    "steps, the CSV log has them", timeout_s, WANDB_TIMEOUT_VARIABLE)
        return False
    return True


def cluster_plugins() -> list:
    """The Trainer plugins that turn Lightning's own SLURM auto-requeue off (RequeueOnSignal replaces it); none
    outside SLURM."""
    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def slurm_job_id() -> str | None:
    """The id `scontrol requeue` takes: <array job>_<task> for a job array's task, else the job id."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array_job}_{task}" if array_job and task else os.environ.get("SLURM_JOB_ID")
    return job if job and re.fullmatch(r"[0-9_]+", job) else None


def requeue_slurm_job() -> str:
    """`scontrol requeue` this job (rank 0, after the checkpoint is saved); returns the job id. Raises RuntimeError
    saying what failed (outside SLURM, scontrol missing or refusing, e.g. for a job submitted without --requeue)."""
    job = slurm_job_id()
    if job is None:
        raise RuntimeError("a requeue was requested, but this process is not in a SLURM job (no SLURM_JOB_ID)")
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True,
                                timeout=SCONTROL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"`scontrol requeue {job}` could not run: {error}") from None
    if result.returncode != 0:
        raise RuntimeError(f"`scontrol requeue {job}` failed with exit status {result.returncode}: "
                           f"{(result.stderr or result.stdout).strip()}")
    log.info("requeued SLURM job %s", job)
    return job
