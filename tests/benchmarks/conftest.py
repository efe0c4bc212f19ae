"""The benchmark scripts as users run them: `python benchmarks/<script>.py ...` from the repository root."""
from __future__ import annotations

import sys

import pytest

from tests.helpers.common_fixtures import REPO_ROOT
from tests.helpers.scripts import script_runner

BENCHMARKS = REPO_ROOT / "benchmarks"


@pytest.fixture(scope="session")
def benchmark_script():
    return script_runner(BENCHMARKS)


@pytest.fixture(scope="session")
def benchmarks_importable():
    """benchmarks/ on sys.path, as it is for a script run from there (its modules import each other by name)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return BENCHMARKS
