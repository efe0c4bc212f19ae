"""What identifies a local file's content short of reading it: its inode, size, mtime and ctime. Not size and mtime
alone: `cp -p`, `rsync -a` or `touch -r` put those back over new bytes, while a write, a replacement or a utime call
gives a new ctime (or inode), which only the kernel sets. Not the device number, which differs between the nodes that
mount the same NFS file. Read before the file is: a write meanwhile moves the ctime. And by reading it: files_sha256."""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path


def file_stamp(path: str | os.PathLike) -> dict[str, int]:
    stat = os.stat(path)
    return {"inode": stat.st_ino, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns}


def files_sha256(paths: Iterable[Path], base: Path) -> str:
    """One sha256 over files, each by its path under `base` and its content (a code snapshot, a checkpoint)."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.relative_to(base)).encode() + b"\0")
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
