"""Loggers from the `logger` config: the CSV log always (the curves plot reads it), Weights & Biases by `mode`.

    disabled   no W&B at all
    offline    <output_dir>/wandb/offline-run-*/run-*.wandb; no network. Upload later: `wandb sync <that dir>`
    online     streams to W&B; the API key is read by wandb from WANDB_API_KEY and nowhere else

A run keeps one W&B run across restarts: its id is written to <output_dir>/wandb/run_id when the run starts, and a
resumed run (from a checkpoint, or a SLURM requeue) continues the W&B run of that id, so one training phase is one
curve on the dashboard whatever the number of requeues.

The key never passes through this code: it is not read, logged, or put into any config (Lightning's
hyperparameters, Hydra's .hydra/ dump and W&B's run config hold only the training config). W&B's files (run
directory, cache, artefact staging) are kept inside the run's output directory unless WANDB_DIR / WANDB_CACHE_DIR
/ WANDB_DATA_DIR say otherwise.
"""
from __future__ import annotations

import contextlib
import csv
import os
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pytorch_lightning.loggers import CSVLogger, Logger, WandbLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter
from pytorch_lightning.loggers.logger import rank_zero_experiment

from pipeline.core.checkpoints.atomic_files import write_atomically
from pipeline.core.devices import is_first_process
from pipeline.core.run.logger_config import (
    CSV_DIR,
    check_logger_config,
    csv_metrics_path,  # noqa: F401  (its callers import it from here too)
)

WANDB_RUN_ID_FILE = Path("wandb") / "run_id"


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer, except that it continues an existing metrics.csv instead of deleting it."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as handle:
                self.metrics_keys = sorted(next(csv.reader(handle), []))


class ResumableCSVLogger(CSVLogger):
    """A CSVLogger flushed at every log step, so a run killed without warning keeps its log up to its last logged
    step; with append=True (a resumed run) it continues the run's metrics.csv. The steps between the checkpoint and
    the crash then appear twice: the plot keeps the later rows."""

    def __init__(self, *args: Any, append: bool = False, **kwargs: Any):
        super().__init__(*args, flush_logs_every_n_steps=1, **kwargs)
        self._append = append

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None and self._append:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return super().experiment


class FinishingWandbLogger(WandbLogger):
    """Lightning's WandbLogger, finished explicitly: at the end of a run (train() calls finish), or marked preempted
    when the run stops to be requeued (pipeline/core/cluster/requeue.py; the requeued job continues the same run id).

    Also where Lightning's own SLURM auto-requeue is still on (fine-tuning): its SIGUSR1 handler finalizes the
    loggers with status "finished" (its normal teardown says "success" or "failed"), writes the checkpoint and
    requeues the job, whose processes are then killed, W&B's service among them; finishing first writes out every
    step logged so far (offline: into the run's file; online: to the server), which the killed service would lose.
    What is logged after that is dropped: the requeued job redoes those steps from the checkpoint."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._finished = False

    def finalize(self, status: str) -> None:
        super().finalize(status)
        if status == "finished":   # Lightning's requeue signal handler; see the class docstring
            self.finish()

    def finish(self, preempted_exit_code: int | None = None, exit_code: int = 0) -> None:
        """Finish the W&B run (once) with exit_code; with preempted_exit_code, marked preempted (W&B's preempting
        record, then that exit code: W&B shows a run so ended as preempted)."""
        if self._finished:
            return
        self._finished = True    # first: a finish that hangs or fails (requeue.py gives up on it) is not tried again
        if self._experiment is not None:
            if preempted_exit_code is not None:
                self._experiment.mark_preempting()
                self._experiment.finish(exit_code=preempted_exit_code)
                # and W&B's service stopped now, before the requeue's SIGTERM stops it under the process's exit hook
                import wandb

                wandb.teardown()
            else:
                self._experiment.finish(exit_code=exit_code)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not self._finished:
            super().log_metrics(metrics, step)


def build_loggers(cfg: Mapping[str, Any], output_dir: str | Path, run_config: Mapping[str, Any] | None = None,
                  resume: bool = False) -> list[Logger]:
    """cfg: the `logger` config; run_config: the resolved training config, recorded as the W&B run's config;
    resume: continue the output directory's CSV log (a run resumed from a checkpoint) rather than start it anew."""
    check_logger_config(cfg)
    output_dir = Path(output_dir)
    loggers: list[Logger] = [ResumableCSVLogger(save_dir=str(output_dir), name="", version=CSV_DIR, append=resume)]
    mode = cfg.get("mode", "disabled")
    if mode == "disabled":
        return loggers

    (output_dir / "wandb").mkdir(parents=True, exist_ok=True)
    run_id = wandb_run_id(output_dir, resume)
    logger = FinishingWandbLogger(
        save_dir=str(output_dir),
        project=cfg.get("project") or "bert-pretraining",
        entity=cfg.get("entity"),
        name=cfg.get("name"),
        group=cfg.get("group"),
        tags=list(cfg.get("tags") or []),
        log_model=bool(cfg.get("log_model", False)),
        mode=mode,
        config=dict(run_config) if run_config is not None else None,
        id=run_id,
        resume="allow",   # the id's run continues where it exists (online), or starts under that id
    )
    loggers.append(logger)
    return loggers


def wandb_run_id(output_dir: Path, resume: bool) -> str:
    """The W&B run id of this output directory: the one recorded there when resuming, else a new one, recorded (by
    the first process only: the other ranks log nothing to W&B)."""
    path = output_dir / WANDB_RUN_ID_FILE
    if resume and path.is_file():
        recorded = path.read_text(encoding="utf-8").strip()
        if recorded:
            return recorded
    run_id = uuid.uuid4().hex[:16]   # W&B takes any id of letters and digits, unique within the project
    if is_first_process():
        write_atomically(path, run_id + "\n")
    return run_id


@contextlib.contextmanager
def wandb_environment(output_dir: str | Path) -> Iterator[None]:
    """Keep W&B's files in the run: WANDB_DIR, WANDB_CACHE_DIR and WANDB_DATA_DIR point inside output_dir for the
    duration (each only where the environment does not set it already), then are put back."""
    wandb_dir = Path(output_dir) / "wandb"
    wanted = {"WANDB_DIR": str(output_dir), "WANDB_CACHE_DIR": str(wandb_dir / "cache"),
              "WANDB_DATA_DIR": str(wandb_dir / "data")}
    added = [key for key in wanted if key not in os.environ]
    os.environ.update({key: wanted[key] for key in added})
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def finish_wandb(loggers: list[Logger], preempted_exit_code: int | None = None, exit_code: int = 0) -> None:
    """Close the W&B run (Lightning leaves it open), so an offline run's files are complete when train() returns;
    preempted_exit_code: the run stops to be requeued (it continues in the requeued job), see FinishingWandbLogger;
    exit_code: the process's, where it was stopped or failed (W&B then shows the run as failed, not finished)."""
    for logger in loggers:
        if isinstance(logger, FinishingWandbLogger):
            logger.finish(preempted_exit_code, exit_code=exit_code)
