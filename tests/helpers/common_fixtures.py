"""Fixtures that every test folder shares (tests/conftest.py and the studies' conftest.py import them): the real
public data, and one torch thread for the data tests."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# Real public data for tests (corpora, vocabularies, GLUE/SQuAD files): the shared data folder beside the checkout, or
# $BERT_SHARED_DATA. Tests take it from the shared_data fixture only; where it is missing they skip, saying so.
SHARED_DATA = Path(os.environ.get("BERT_SHARED_DATA") or REPO_ROOT.parent / "shared" / "data")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set BERT_SHARED_DATA to its folder)")
    return SHARED_DATA


@pytest.fixture(scope="module")
def one_torch_thread():
    """Data tests: one thread (2 cores shared with other work; the training runs allow 2)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
