"""Which data prep preset (conf/data_prep/NAME.yaml) a command line asks for: `preset=NAME` among Hydra overrides; and
the repository root the configs name as ${repo_root:}.

Shared by data_prep/run.py and the pipeline's programs (pipeline/core/app.py), which compose configs without
importing Beam. The project runs from its checkout (`pip install -e .`): conf/ lives beside the packages.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[1]
PRESET_DIR = REPO_ROOT / "conf" / "data_prep"
DEFAULT_PRESET = "sample"


def register_repo_root_resolver() -> None:
    """${repo_root:}, the checkout's root, for the paths of bundled samples and default outputs in conf/."""
    if not OmegaConf.has_resolver("repo_root"):
        OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT))


def available_presets() -> list[str]:
    return sorted(path.stem for path in PRESET_DIR.glob("*.yaml"))


def split_preset(overrides: list[str]) -> tuple[str, list[str]]:
    """(the preset named by `preset=NAME`, else the default; the other overrides, in order)."""
    preset, rest = DEFAULT_PRESET, []
    for override in overrides:
        if override.startswith("preset="):
            preset = override.split("=", 1)[1]
        else:
            rest.append(override)
    if preset not in available_presets():
        raise ValueError(f"unknown preset {preset!r}; available: {available_presets()}")
    return preset, rest
