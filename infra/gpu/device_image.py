"""An environment on this machine made like the GPU image's, to rehearse a device run's install and imports here.

The image (infra/gpu/device_image_packages.txt, from the device's KINDS.md) has some 200 packages and lacks the
rest of what we use. A fresh venv gets links to this machine's installed copies of the image's packages (its torch,
Lightning, numpy...) and nothing else: DeepSpeed, torchao, Hydra, omegaconf, Beam, datasets, wandb are absent, their
metadata too (Lightning's availability checks read it). So an import that works in it works there, as far as package
presence goes (the torch here is a CPU build of another version; the Python here may be
another minor version: the wheel set is then built for this one, same names and versions). The wheels go in exactly
as the device command puts them (infra/gpu/device_run.sh): `pip install --no-index --no-deps --target <site>`, then
PYTHONPATH=<site>.
"""
from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from packaging.requirements import Requirement

HERE = Path(__file__).resolve().parent
IMAGE_PACKAGES = HERE / "device_image_packages.txt"


def image_packages() -> set[str]:
    lines = IMAGE_PACKAGES.read_text().splitlines()
    return {canonical(line) for line in lines if line.strip() and not line.startswith("#")}


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def top_level_modules(dist: importlib.metadata.Distribution) -> set[str]:
    listed = dist.read_text("top_level.txt")
    if listed:
        return {line.strip() for line in listed.splitlines() if line.strip()}
    names = set()
    for file in dist.files or ():
        first = file.parts[0]
        if first.endswith((".dist-info", ".egg-info", ".data")) or first in ("..", "__pycache__"):
            continue
        names.add(first.removesuffix(".py") if len(file.parts) == 1 else first)
    return {name for name in names if name.isidentifier()}


def image_entries(site_packages: Path, carried: set[str]) -> list[str]:
    """The entries of this Python's site-packages (package folders, modules, extension files, .dist-info) that
    belong to the image's distributions, and to what those need here (a newer huggingface_hub here needs httpx2, the
    image's httpx), never to one of the carried wheels' distributions (those must come from the wheels). Only what
    is installed here: an image package this machine lacks is absent (an import of it fails here, not there)."""
    dists = {canonical(d.metadata["Name"]): d for d in importlib.metadata.distributions(path=[str(site_packages)])
             if d.metadata["Name"]}
    wanted, queue = set(), [name for name in image_packages() if name in dists]
    while queue:
        name = queue.pop()
        if name in wanted or name in carried or name not in dists:
            continue
        wanted.add(name)
        for text in dists[name].requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                queue.append(canonical(requirement.name))
    entries = set()
    for name in wanted:
        for file in dists[name].files or ():
            first = file.parts[0]
            if first not in ("..", "__pycache__") and not first.endswith(".pth"):
                entries.add(first)
    return sorted(entry for entry in entries if (site_packages / entry).exists())


def make_venv(venv: Path, carried: set[str], python: str = sys.executable) -> Path:
    """A venv of `python` without this machine's site-packages, into which the image's packages (this Python's
    copies) are linked; returns its python. pip comes along (the image has it). Another minor version than this
    one's gets them too, for what imports without their compiled parts (the 3.12 check of the GPU's own set)."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
    venv_python = venv / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site_packages = Path(subprocess.run([str(venv_python), "-c", where], check=True, capture_output=True,
                                        text=True).stdout.strip())
    system_site = Path(sysconfig.get_path("purelib"))
    for entry in image_entries(system_site, {canonical(name) for name in carried}):
        (site_packages / entry).symlink_to(system_site / entry)
    return venv_python


def install_wheels(python: Path, wheels: Path, site: Path, log: Path | None = None) -> None:
    """What the device command does: only the folder's wheels, no index, no dependency resolution."""
    files = sorted(str(p) for p in wheels.glob("*.whl"))
    if not files:
        raise FileNotFoundError(f"no wheels in {wheels}: build them with python infra/gpu/device_wheels.py")
    command = [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--target", str(site), *files]
    with open(log or os.devnull, "a") as out:
        subprocess.run(command, check=True, stdout=out, stderr=subprocess.STDOUT)
