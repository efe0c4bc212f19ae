"""What the `logger` config may say and where the CSV log is, without Lightning: the pre-flight checks (and the
workflow's, which check every stage before launching any) import this, so a refusal costs no `import
pytorch_lightning` (about 4.5 CPU-seconds beyond torch's). The loggers themselves are in loggers.py."""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

WANDB_MODES = ("disabled", "offline", "online")
CSV_DIR = "csv"


def csv_metrics_path(output_dir: str | Path) -> Path:
    return Path(output_dir) / CSV_DIR / "metrics.csv"


def check_logger_config(cfg: Mapping[str, Any]) -> None:
    """Refuse, before training, a W&B mode that cannot work."""
    mode = cfg.get("mode", "disabled")
    if mode not in WANDB_MODES:
        raise ValueError(f"logger.mode must be one of {', '.join(WANDB_MODES)}, got {mode!r}")
    if mode == "online" and not os.environ.get("WANDB_API_KEY"):
        raise ValueError("logger.mode=online needs a W&B API key in the WANDB_API_KEY environment variable (it is "
                         "read from there only, never from a config); or use logger.mode=offline and "
                         "`wandb sync` the run directory later")
