"""Files that are either absent, the old version, or the whole new one, whatever kills the writer, on any filesystem:
the bytes go to a temporary file in the target's own directory, are fsynced, and replace the target with one atomic
rename, which is then made durable by syncing the directory. Torch-free (the workflow's stage processes use it).

The file gets the mode a plain open() would give it (0666 less the umask, or what the directory's default ACL says):
a project group reads the checkpoints (last.ckpt, DeepSpeed's `latest`) and records of a run, as it reads everything
else the run writes. Not mkstemp's 0600.
"""
from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from pipeline.core.checkpoints.checkpoint_files import PARTIAL_PREFIX, PARTIAL_SUFFIX

_CREATE_ATTEMPTS = 100


@contextlib.contextmanager
def atomic_file(target: str | Path) -> Iterator[BinaryIO]:
    """Write the target through the yielded binary handle; it appears only when the block ends without error."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = _create_temporary(target.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)   # the rename itself survives a crash of the machine


def write_atomically(target: str | Path, text: str) -> None:
    with atomic_file(target) as out:
        out.write(text.encode("utf-8"))


def _create_temporary(directory: Path) -> tuple[int, Path]:
    """A new, empty file in `directory` under a random name (exclusive create, as mkstemp), opened for writing.

    Created with mode 0666, so that the kernel applies the umask at creation, exactly as for open(path, "w"). Not by
    reading the umask and chmod-ing: os.umask can only be read by setting it, process-wide, so a thread creating a
    file meanwhile would get the wrong mode; /proc/self/status's Umask line is Linux-only; and with a default ACL on
    the directory the kernel ignores the umask, which a chmod from it would override."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_CREATE_ATTEMPTS):
        # Temporary names never contain "hpc_ckpt_", which Lightning parses for the SLURM requeue's version number.
        temporary = directory / f"{PARTIAL_PREFIX}{secrets.token_hex(8)}{PARTIAL_SUFFIX}"
        try:
            return os.open(temporary, flags, 0o666), temporary
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {directory} after {_CREATE_ATTEMPTS} attempts")


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
