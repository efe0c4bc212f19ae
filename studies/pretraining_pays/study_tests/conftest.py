"""The study's scripts as users run them (`python studies/pretraining_pays/<script>.py ...` from the repository root),
its modules as they import each other (by name, the study's folder on the path), and the fixtures shared with tests/
(tests/helpers/common_fixtures.py: the real data, one torch thread); few threads."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.helpers.common_fixtures import one_torch_thread, shared_data  # noqa: F401  (fixtures)
from tests.helpers.scripts import script_runner

STUDY = Path(__file__).resolve().parents[1]

# Two cores shared with other work: few threads everywhere, subprocesses included.
os.environ.setdefault("OMP_NUM_THREADS", "2")          # .ci/run sets 1 (tests/conftest.py says why)
os.environ.setdefault("MKL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])
os.environ.setdefault("RAYON_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def study_script():
    return script_runner(STUDY)


@pytest.fixture(scope="session")
def study_importable():
    """The study's folder on sys.path, as it is for a script run from there (its modules import each other by name)."""
    if str(STUDY) not in sys.path:
        sys.path.insert(0, str(STUDY))
    return STUDY


@pytest.fixture(scope="session", autouse=True)
def _torch_threads():
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
