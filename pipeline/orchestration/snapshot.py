"""The code a launch runs: a copy of the checkout's source (the packages, conf/, infra/) taken at launch under
<root>/_workflow/code/<hash of its files>/. Snakemake, the SLURM controller and every stage job (and each of their
requeues) run from that copy, so an edit or a `git pull` in the checkout changes nothing in flight; the next launch
takes a new copy if the files changed (the same files share one)."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from pipeline.core.app import REPO_ROOT

SOURCES = ("pipeline", "model", "data_prep", "conf", "infra", "pyproject.toml")


def source_files(repo: Path = REPO_ROOT) -> list[Path]:
    files = [p for top in SOURCES for p in ([repo / top] if (repo / top).is_file() else (repo / top).rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts and not any(part.startswith(".") for part in
                                                                          p.relative_to(repo).parts)]
    return sorted(files)


def take_snapshot(state_dir: Path, repo: Path = REPO_ROOT) -> Path:
    """The copy's root (it is importable: its pipeline/, model/ and data_prep/ are the packages)."""
    files = source_files(repo)
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes() + b"\0")
    target = state_dir / "code" / digest.hexdigest()[:12]
    if not target.is_dir():
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        for path in files:
            (partial / path.relative_to(repo)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, partial / path.relative_to(repo))
        try:
            os.rename(partial, target)
        except OSError:                      # another launch made the same copy meanwhile
            shutil.rmtree(partial)
    return target
