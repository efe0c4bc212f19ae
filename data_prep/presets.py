"""Which data prep preset (conf/data_prep/NAME.yaml) a command line asks for: `preset=NAME` among Hydra overrides;
the repository root the configs name as ${repo_root:}; and the one Hydra compose outside a Hydra app.

Shared by data_prep/run.py and the pipeline's programs (pipeline/core/app.py), which compose configs without
importing Beam. The project runs from its checkout (`pip install -e .`): conf/ lives beside the packages.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[1]
PRESET_DIR = REPO_ROOT / "conf" / "data_prep"
DEFAULT_PRESET = "sample"


def register_repo_root_resolver() -> None:
    """${repo_root:}, the checkout's root, for the paths of bundled samples and default outputs in conf/."""
    if not OmegaConf.has_resolver("repo_root"):
        OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT))


def compose_config(config_dir: Path, config_name: str | None, overrides: Sequence[str] = ()) -> DictConfig:
    """A config composed outside a Hydra app, unresolved: data prep's presets, the pipeline's programs, the workflow's
    stages (pipeline/core/app.py)."""
    from hydra import compose, initialize_config_dir

    register_repo_root_resolver()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


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
