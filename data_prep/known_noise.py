"""Silence messages that are known to be harmless, so the user sees the job's own progress and real warnings.

Each entry says why it is harmless here; anything not listed still shows. Installed by the entry points
(data_prep/run.py, pipeline/train.py, pipeline/finetune.py) before the libraries that emit them are imported.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator

# Log messages (prefixes), with the logger they come from.
_HARMLESS_LOG_MESSAGES = {
    # apache_beam.io.gcp imports a BigQuery client that needs apitools, which only the [gcp] extra installs;
    # nothing here uses BigQuery (and on Dataflow, with the extra, the message does not appear).
    "root": ("apitools not found, and bigquery client libraries are not available",),
    # The same module's note that its BigQuery storage client is not installed, logged when training verifies a shard
    # set through Beam's FileSystems (pipeline/pretraining/data/verify.py); nothing here reads BigQuery.
    "apache_beam.io.gcp.bigquery": ("No module named google.cloud.bigquery_storage_v1",),
    # Beam's SDK worker on the local runners: no cross-bundle state directory, which this job never uses.
    "__main__": ("No semi_persistent_directory found", "Logging handler created."),
    # An advertisement printed by every Trainer that has no LitLogger.
    "pytorch_lightning.utilities.rank_zero": ("💡 Tip: For seamless cloud logging",),
}


class _DropPrefixes(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def silence_known_noise() -> None:
    for logger_name, prefixes in _HARMLESS_LOG_MESSAGES.items():
        logger = logging.getLogger(None if logger_name == "root" else logger_name)
        if not any(isinstance(f, _DropPrefixes) for f in logger.filters):
            logger.addFilter(_DropPrefixes(prefixes))
    # pytorch_lightning's own use of a torch pytree API that torch deprecated; nothing this project calls.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    if "SLURM_JOB_ID" not in os.environ:
        # Outside a SLURM allocation, having srun installed says nothing about this run; inside one, a run
        # started without srun may well be a mistake, so the hint stays.
        warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")


# The same messages as Beam's local worker processes print them (they inherit our stderr, not our logging).
_HARMLESS_WORKER_LINES = tuple(f"{level}:{name}:{prefix}".encode() for name, prefixes in _HARMLESS_LOG_MESSAGES.items()
                               for prefix in prefixes for level in ("INFO", "WARNING"))


@contextlib.contextmanager
def worker_stderr_filtered() -> Iterator[None]:
    """While the block runs, lines written to file descriptor 2 (by this process or by the worker processes it
    starts) pass through a thread that drops the known-harmless ones and forwards everything else unchanged."""
    sys.stderr.flush()
    original = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward() -> None:
        with os.fdopen(read_end, "rb") as lines, os.fdopen(os.dup(original), "wb", buffering=0) as out:
            for line in lines:
                if not line.startswith(_HARMLESS_WORKER_LINES):
                    out.write(line)

    thread = threading.Thread(target=forward, name="stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)   # closes the pipe's last write end here; the workers have exited by now
        os.close(original)
        thread.join(timeout=5)
