"""The workflow tests' fixtures: the tiny workflow run from a copy of this checkout (tests/helpers/workflows.py)."""
from __future__ import annotations

import pytest

from tests.helpers.workflows import Workflow, copy_checkout


@pytest.fixture
def tiny_workflow(tmp_path) -> Workflow:
    return Workflow(copy_checkout(tmp_path / "checkout"), tmp_path / "wf")


@pytest.fixture
def readme_workflow(tmp_path) -> Workflow:
    """The README's command as written, from the repository root."""
    return Workflow(copy_checkout(tmp_path / "checkout"), None)
