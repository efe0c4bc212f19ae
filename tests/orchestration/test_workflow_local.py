"""The tiny workflow end to end with the local launcher: data prep x2, pre-training x2, export, SST-2, report; then
a re-run skips everything done, and a changed downstream setting re-runs only that stage (and the report)."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
STAGES = ["prep_phase1", "prep_phase2", "pretrain_phase1", "pretrain_phase2", "export", "finetune_sst2"]


def workflow_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1", "WANDB_MODE": "disabled",
            "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}


def run_workflow(root: Path, *extra: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "pipeline/workflow.py", "+workflow=tiny", f"workflow.root={root}", *extra],
                          cwd=REPO_ROOT, env=env or workflow_env(), capture_output=True, text=True, timeout=timeout)


def stage_lines(stdout: str) -> dict[str, list[str]]:
    lines: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and line.startswith("  "):
            lines.setdefault(parts[0], []).append(parts[1])
    return lines


@pytest.mark.slow
def test_tiny_workflow_runs_the_whole_chain_locally_and_reruns_cheaply(tmp_path):
    root = tmp_path / "wf"
    first = run_workflow(root)
    assert first.returncode == 0, first.stdout + first.stderr
    for stage in STAGES:
        marker = json.loads((root / "_workflow" / "markers" / f"{stage}.json").read_text())
        assert marker["state"] == "done", marker
        print(f"{stage}: {marker['wall_seconds']:.1f} s")
    assert (root / "pretrain_phase2" / "checkpoints" / "last.ckpt").is_file()
    assert "init_from_checkpoint=" + str(root / "pretrain_phase1" / "checkpoints" / "last.ckpt") in \
        (root / "_workflow" / "logs" / "pretrain_phase2.log").read_text()
    assert (root / "export" / "model.safetensors").is_file()
    scores = list(csv.DictReader(open(root / "report" / "scores.csv")))
    assert [(s["task"], s["metric"]) for s in scores] == [("sst2", "acc")] and 0 <= float(scores[0]["score"]) <= 1
    stages = {row["stage"]: row["state"] for row in csv.DictReader(open(root / "report" / "stages.csv"))}
    assert stages == dict.fromkeys(STAGES, "done")
    assert "| sst2 | acc |" in (root / "report" / "report.md").read_text()

    again = run_workflow(root)
    assert again.returncode == 0, again.stdout + again.stderr
    lines = stage_lines(again.stdout)
    for stage in STAGES:
        assert lines[stage] == ["skipped: done, same config and inputs"], again.stdout

    changed = run_workflow(root, "workflow.downstream.overrides=['data.limit_train_examples=256',"
                                 "'trainer.max_epochs=1','trainer.enable_progress_bar=false']")
    assert changed.returncode == 0, changed.stdout + changed.stderr
    lines = stage_lines(changed.stdout)
    assert [s for s in STAGES if not lines[s][0].startswith("skipped")] == ["finetune_sst2"], changed.stdout

    status = run_workflow(root, "workflow.action=status", "workflow.downstream.overrides=["
                          "'data.limit_train_examples=256','trainer.max_epochs=1','trainer.enable_progress_bar=false']")
    states = {name: text[0].split()[0] for name, text in stage_lines(status.stdout).items() if name in STAGES}
    assert states == dict.fromkeys(STAGES, "done"), status.stdout
