"""data_prep installs on its own (`pip install -e .`, what Dataflow workers get): every package it imports is
declared, and none of them pulls in torch."""
from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = {"data_prep", "model", "pipeline"}


def project() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def distribution_name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def imported_distributions() -> dict[str, set[str]]:
    """distribution -> the data_prep files that import it (top-level modules mapped by importlib.metadata)."""
    owners = importlib.metadata.packages_distributions()
    found: dict[str, set[str]] = {}
    for path in sorted((REPO_ROOT / "data_prep").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            for name in names:
                top = name.split(".")[0]
                if top in FIRST_PARTY or top in sys.stdlib_module_names:
                    continue
                for dist in owners.get(top, [top]):
                    found.setdefault(re.sub(r"[-_.]+", "-", dist).lower(), set()).add(path.name)
    return found


def test_every_package_data_prep_imports_is_declared():
    declared = {distribution_name(r) for r in project()["dependencies"]}
    extras = project()["optional-dependencies"]
    optional = {distribution_name(r) for extra in ("dask", "dataflow") for r in extras[extra]}
    undeclared = {dist: files for dist, files in imported_distributions().items()
                  if dist not in declared | optional}
    assert not undeclared, f"imported by data_prep but not declared in pyproject.toml: {undeclared}"


def test_the_data_prep_install_needs_no_torch():
    """The base dependencies and everything they require (markers evaluated, extras not taken) hold no torch."""
    seen: set[str] = set()
    pending = [Requirement(r) for r in project()["dependencies"]]
    while pending:
        requirement = pending.pop()
        name = distribution_name(str(requirement))
        if name in seen or (requirement.marker is not None and not requirement.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        pending += [Requirement(r) for r in importlib.metadata.requires(name) or []]
    assert "torch" not in seen, "a data_prep dependency pulls in torch"
    assert {"apache-beam", "crc32c", "tokenizers"} <= seen
