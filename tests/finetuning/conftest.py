"""Fixtures of the fine-tuning tests: one `datasets` cache per module, the real downstream data."""
from __future__ import annotations

import os
from pathlib import Path

# Never the network; no progress bars in the test log.  Set before `datasets` is imported.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One datasets cache for the module: the real files are then parsed once."""
    return tmp_path_factory.mktemp("hf_datasets_cache")


@pytest.fixture(scope="module")
def downstream(shared_data) -> Path:
    return shared_data / "downstream"
