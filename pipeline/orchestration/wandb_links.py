"""Where a stage's W&B run can be seen: the run's URL (online; W&B prints it in the log), or its offline directory
(for `wandb sync`). Nothing when W&B was off."""
from __future__ import annotations

import re
from pathlib import Path

RUN_URL = re.compile(r"https?://\S+/runs/[\w-]+")


def wandb_links(output_dir: Path, log_path: Path | None) -> list[str]:
    links: list[str] = []
    if log_path is not None and Path(log_path).is_file():
        text = Path(log_path).read_text(encoding="utf-8", errors="replace")
        links += list(dict.fromkeys(RUN_URL.findall(text)))
    for run_dir in sorted(Path(output_dir).glob("wandb/offline-run-*")):
        links.append(f"offline: {run_dir} (upload with `wandb sync {run_dir}`)")
    if not links:
        # an online run whose URL did not reach a log we can read: its files still name the run
        links += [f"run files: {d}" for d in sorted(Path(output_dir).glob("wandb/run-*"))]
    return links
