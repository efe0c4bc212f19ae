"""Small files that readers find absent, old or whole, never cut off, whatever kills the writer.

On a local disk as pipeline/core/checkpoints/atomic_files.py does it: a new temporary file in the same directory (mode
as a plain open() gives, not mkstemp's 0600), fsynced, one atomic rename over the target, the directory synced. That
module cannot be imported from here: `python data_prep/run.py` puts data_prep/ first on sys.path, where
data_prep/pipeline.py shadows the pipeline package. Elsewhere (gs://, s3://, hdfs://) as data_prep writes its shards: a
temporary name, then a rename.
"""
from __future__ import annotations

import os
import uuid

from apache_beam.io.filesystems import FileSystems


def write_whole(path: str, data: bytes) -> None:
    if "://" not in path:
        _write_local(path, data)
        return
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    with FileSystems.create(temporary) as handle:
        handle.write(data)
    if FileSystems.exists(path):     # not every filesystem's rename replaces its target (HDFS's does not)
        FileSystems.delete([path])
    FileSystems.rename([temporary], [path])


def _write_local(path: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)         # the rename itself survives a crash of the machine
    except OSError:                  # some filesystems do not sync directories; the rename is still atomic
        pass
    finally:
        os.close(descriptor)
