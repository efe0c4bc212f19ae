"""Where the study's downstream results live, and what the report reads of them: one small JSON file per result,
written atomically, so a run that stops keeps everything finished before and a re-run skips it.

    <out>/finetune/<arm>/<task>/<budget>/seed<N>.json    a fine-tuning, probe or bag-of-words result
    <out>/finetune/<arm>/zeroshot/sst2.json              zero-shot SST-2 (one per arm)
    <out>/finetune/<arm>/rates/<task>/lr<rate>.json      one try of the rate selection; rates/<task>.json: the choice
    <out>/finetune/<arm>/runs/...                         the fine-tuning runs' own outputs (metrics.json, predictions)

A result file: {"arm", "task", "budget", "seed", "quick", "metrics": {name: value}, ...what made it}.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ARMS = ("random_general", "random_domain", "general_60", "general_120", "domain_60", "domain_120", "domain_60_other")
BAG_OF_WORDS = "bag_of_words"
NOT_ARMS = ("data", "cache")     # <out>/finetune/data: the task files; <out>/finetune/cache: `datasets`' cache
# a pre-trained arm against the random arm of its vocabulary
RANDOM_ARM = {"general_60": "random_general", "general_120": "random_general", "domain_60": "random_domain",
              "domain_120": "random_domain", "domain_60_other": "random_domain"}

# (task, budget, metric, label): every cell of the table, in its order
CELLS = (
    ("sst2", "500", "acc", "SST-2 500"),
    ("sst2", "1000", "acc", "SST-2 1,000"),
    ("sst2", "5000", "acc", "SST-2 5,000"),
    ("imdb", "1000", "acc", "IMDB 1,000"),
    ("stsb", "full", "pearson", "STS-B Pearson"),
    ("stsb", "full", "spearman", "STS-B Spearman"),
    ("cola", "full", "mcc", "CoLA MCC"),
    ("probe", "1000", "last_mean", "probe: last layer"),
    ("probe", "1000", "scalar_mix_mean", "probe: scalar mix"),
)


def finetune_root(out: Path) -> Path:
    return Path(out) / "finetune"


def result_path(out: Path, arm: str, task: str, budget: int | str, seed: int) -> Path:
    return finetune_root(out) / arm / task / str(budget) / f"seed{seed}.json"


def zeroshot_path(out: Path, arm: str) -> Path:
    return finetune_root(out) / arm / "zeroshot" / "sst2.json"


def rate_try_path(out: Path, arm: str, task: str, lr: float) -> Path:
    return finetune_root(out) / arm / "rates" / task / f"lr{lr:g}.json"


def rate_choice_path(out: Path, arm: str, task: str) -> Path:
    return finetune_root(out) / arm / "rates" / f"{task}.json"


def write_json(path: Path, record: dict[str, Any]) -> Path:
    """Atomically: a reader (or a re-run) sees the whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path


def read_done(path: Path, quick: bool) -> dict[str, Any] | None:
    """The result at `path` if there is one; refuses one of the other scale (a quick run's numbers must never stand in
    for the study's, nor the other way round)."""
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    if bool(record.get("quick")) != quick:
        raise ValueError(f"{path} holds a {'quick' if record.get('quick') else 'full-scale'} result and this run is "
                         f"{'quick' if quick else 'full-scale'}: give the two their own output directories")
    return record


def collect(out: Path) -> dict[str, Any]:
    """Every result under <out>/finetune: {"cells": {arm: {(task, budget): {seed: record}}}, "zeroshot": {arm: record},
    "rates": {arm: {task: record}}}."""
    root = finetune_root(out)
    cells: dict[str, dict[tuple[str, str], dict[int, dict]]] = {}
    zeroshot: dict[str, dict] = {}
    rates: dict[str, dict[str, dict]] = {}
    arm_dirs = sorted(path for path in root.glob("*") if path.is_dir() and path.name not in NOT_ARMS)
    for arm_dir in arm_dirs:
        for path in sorted(arm_dir.glob("*/*/seed*.json")):
            record = json.loads(path.read_text(encoding="utf-8"))
            cells.setdefault(record["arm"], {}).setdefault((record["task"], str(record["budget"])), {})[
                int(record["seed"])] = record
        if zeroshot_path(out, arm_dir.name).is_file():
            zeroshot[arm_dir.name] = json.loads(zeroshot_path(out, arm_dir.name).read_text(encoding="utf-8"))
        for path in sorted((arm_dir / "rates").glob("*.json")):
            record = json.loads(path.read_text(encoding="utf-8"))
            rates.setdefault(record["arm"], {})[record["task"]] = record
    return {"cells": cells, "zeroshot": zeroshot, "rates": rates}
