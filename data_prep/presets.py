"""Which data prep preset (conf/data_prep/NAME.yaml) a command line asks for: `preset=NAME` among Hydra overrides.

Shared by data_prep/run.py and the workflow (pipeline/orchestration/entries.py), which composes a data prep stage's
config without importing Beam.
"""
from __future__ import annotations

from pathlib import Path

PRESET_DIR = Path(__file__).resolve().parents[1] / "conf" / "data_prep"
DEFAULT_PRESET = "sample"


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
