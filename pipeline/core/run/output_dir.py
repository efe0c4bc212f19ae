"""A run's output directory, from its config: what the run record, the run directory's lock and every program
write under."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from omegaconf.errors import InterpolationResolutionError


def output_dir(cfg: DictConfig, program: str) -> Path:
    """The run's output directory: Hydra's run directory under `python pipeline/<program>.py`, output_dir=... when a
    program's function is called directly."""
    try:
        value = cfg.output_dir
    except (InterpolationResolutionError, ValueError) as error:
        raise ValueError(f"output_dir is not set: `python pipeline/{program}.py` takes Hydra's run directory; when "
                         f"calling its function yourself, pass output_dir=<directory>") from error
    if not value:
        raise ValueError("output_dir is empty")
    return Path(value).resolve()
