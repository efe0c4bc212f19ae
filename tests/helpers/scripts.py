"""A repository script run as users run it: a separate program, from the repository root, with this checkout's code
(PYTHONPATH is the repository). The benchmark and study fixtures run theirs through it."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.helpers.common_fixtures import REPO_ROOT


def script_runner(folder: Path) -> Callable[..., subprocess.CompletedProcess]:
    """run(script, *args, timeout=1800, **env): `python <folder>/<script> args...`, its output captured."""
    def run(script: str, *args: str, timeout: float = 1800, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(folder / script), *args], cwd=REPO_ROOT,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env},
                              capture_output=True, text=True, timeout=timeout)
    return run
