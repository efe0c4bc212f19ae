"""The benchmark scripts as users run them: `python benchmarks/<script>.py ...` from the repository root."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO_ROOT / "benchmarks"


def run_script(script: str, *args: str, timeout: float = 1800, **env: str) -> subprocess.CompletedProcess:
    """A benchmark script as a separate program (this checkout's code: PYTHONPATH is the repository)."""
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=REPO_ROOT,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env},
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def benchmark_script():
    return run_script


@pytest.fixture(scope="session")
def benchmarks_importable():
    """benchmarks/ on sys.path, as it is for a script run from there (its modules import each other by name)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return BENCHMARKS
