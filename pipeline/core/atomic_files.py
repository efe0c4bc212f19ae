"""Files that are either absent, the old version, or the whole new one, whatever kills the writer, on any filesystem:
the bytes go to a temporary file in the target's own directory, are fsynced, and replace the target with one atomic
rename, which is then made durable by syncing the directory. Torch-free (the workflow's stage processes use it)."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from pipeline.core.checkpoint_files import PARTIAL_PREFIX, PARTIAL_SUFFIX


@contextlib.contextmanager
def atomic_file(target: str | Path) -> Iterator[BinaryIO]:
    """Write the target through the yielded binary handle; it appears only when the block ends without error."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Temporary names never contain "hpc_ckpt_", which Lightning parses for the SLURM requeue's version number.
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=PARTIAL_PREFIX, suffix=PARTIAL_SUFFIX)
    try:
        with os.fdopen(handle, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)   # the rename itself survives a crash of the machine


def write_atomically(target: str | Path, text: str) -> None:
    with atomic_file(target) as out:
        out.write(text.encode("utf-8"))


def _fsync_directory(directory: Path) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:   # some filesystems do not sync directories; the rename is still atomic
        pass
    finally:
        os.close(descriptor)
