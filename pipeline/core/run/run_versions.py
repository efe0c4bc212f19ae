"""The code and the packages a run trains with, as its record keeps them (pipeline/core/run/run_record.py): a resume
under other code or other packages refuses, naming them, unless the change is accepted (resume.accept_changes=[code] or
[packages.torch]).

infra/slurm/train.sbatch starts every requeue from the live checkout: a `git pull` or a `pip install -U` between two
requeues would otherwise change the run half-way without a word, and a config key that the new code added would fail
the requeue as a change from nothing. The code counts by content: the sha256 of every Python source of the packages
that train (model/, pipeline/, data_prep/), edits not committed included, so a pull that touches only the README or
the tests changes nothing. The commit is kept beside it for the reader (None outside a git checkout). The configs are
not here: the run's resolved config is compared key by key.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import subprocess
from pathlib import Path
from typing import Any

from data_prep.presets import REPO_ROOT

CODE_PACKAGES = ("model", "pipeline", "data_prep")
# What computes a training step or its schedule: another version may round, fuse or step differently
TRAINING_PACKAGES = ("torch", "pytorch-lightning", "deepspeed", "pytorch-optimizer", "torchao")
NOT_INSTALLED = "not installed"


@functools.cache
def code_sources_sha256(root: Path = REPO_ROOT) -> str:
    """sha256 over the path and bytes of every .py file under CODE_PACKAGES (sorted; caches excluded), once per
    process: the code it runs is the code it imported."""
    digest = hashlib.sha256()
    for package in CODE_PACKAGES:
        for source in sorted((root / package).rglob("*.py")):
            if "__pycache__" in source.parts:
                continue
            digest.update(source.relative_to(root).as_posix().encode() + b"\0")
            digest.update(source.read_bytes() + b"\0")
    return digest.hexdigest()


def git_commit(root: Path = REPO_ROOT) -> str | None:
    """The checkout's commit (None outside a git checkout, or without git): for the reader only."""
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def package_versions() -> dict[str, str]:
    versions = {}
    for name in TRAINING_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = NOT_INSTALLED
    return versions


def run_versions() -> dict[str, Any]:
    """{"code": {"sources_sha256", "commit"}, "packages": {name: version}}, as the record keeps them."""
    return {"code": {"sources_sha256": code_sources_sha256(), "commit": git_commit()},
            "packages": package_versions()}


def describe_code(code: dict[str, Any] | None) -> str:
    if not code:
        return "(absent)"
    commit = code.get("commit")
    where = f"commit {commit[:12]}" if commit else "no git commit"
    return f"{where}, sources sha256 {str(code.get('sources_sha256'))[:12]}"
