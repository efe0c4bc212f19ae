"""What several test files build alike (a shard set, an exported model, a finished tiny run), built once per test run:
with pytest-xdist (.ci/run's two workers) in the folder the workers share, the first to need it builds it under a
lock (flock) while the other waits, then both read it (pytest-xdist's recipe for session fixtures). Keyed by what goes
into the build, so that two builds that differ never meet. A test that writes into a build takes a copy of it."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path


def shared_root(tmp_path_factory) -> Path:
    """This session's temporary folder; under pytest-xdist, the one its workers' folders are in."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory, name: str, key, build: Callable[[Path], object], leaf: str = "") -> Path:
    """`build(path)` into a folder of its own unless a finished build of the same `name` and `key` (anything JSON
    writes: the build's inputs) is there. Returns that folder (or its `leaf` inside it, where the build writes)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]
    folder = shared_root(tmp_path_factory) / "shared_builds" / f"{name}-{digest}"
    target = folder / leaf if leaf else folder
    done = folder.with_name(folder.name + ".done")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _locked(folder.with_name(folder.name + ".lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)     # what a build that failed midway left
            folder.mkdir()
            build(target)
            done.touch()
    return target


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on `path` (flock: the kernel lets it go with the process, should a worker die holding it)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
