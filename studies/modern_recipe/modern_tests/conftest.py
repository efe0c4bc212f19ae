"""The modern-recipe study's script as users run it (`python studies/modern_recipe/bench_modern.py ...` from the
repository root), its modules as they import each other (by name, its folder on the path), and the fixtures shared
with tests/ (the real data); few threads, as the first studies' tests."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.helpers.common_fixtures import shared_data  # noqa: F401  (fixture)
from tests.helpers.scripts import script_runner

ROOM = Path(__file__).resolve().parents[1]

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])
os.environ.setdefault("RAYON_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def modern_script():
    return script_runner(ROOM)


@pytest.fixture(scope="session")
def modern_importable():
    """The room's folder on sys.path, as it is for its script (its modules import each other by name)."""
    if str(ROOM) not in sys.path:
        sys.path.insert(0, str(ROOM))
    return ROOM
