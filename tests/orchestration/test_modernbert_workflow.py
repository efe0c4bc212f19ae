"""ModernBERT's three phases as one workflow, at the tiny size on the CPU, run exactly as the README writes it
(`python pipeline/workflow.py +workflow=modernbert_tiny`, from a copy of the checkout): phase 1 with a batch warm-up,
the context extension from phase 1's weights, the decay resumed from the extension's last checkpoint, each phase
exported, SST-2 from the decayed model, the report; run again, nothing runs."""
from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from tests.helpers.workflows import copy_checkout, workflow_env

COMMAND = [sys.executable, "pipeline/workflow.py", "+workflow=modernbert_tiny"]


def logged(run_dir, column: str) -> dict[int, float]:
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        return {int(row["step"]): float(row[column]) for row in csv.DictReader(handle) if row.get(column)}


@pytest.mark.slow
def test_the_modernbert_workflow_runs_its_three_phases_and_sst2_as_the_readme_says(tmp_path):
    repo = copy_checkout(tmp_path / "checkout")
    done = subprocess.run(COMMAND, cwd=repo, env=workflow_env(repo), capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    root = repo / "outputs" / "workflows" / "modernbert_tiny"
    for export in ("export_phase1", "export_context", "export"):
        assert (root / export / "current" / "model.safetensors").is_file(), export
    phase1, context, decay = (root / stage / "current" for stage in ("pretrain_phase1", "pretrain_context",
                                                                     "pretrain_decay"))
    assert {p.name for p in (phase1 / "checkpoints").glob("step*.ckpt")} == {"step0000010.ckpt", "step0000020.ckpt"}
    # The decay continued the extension's final state: its steps 6-8 follow the extension's 0-5, the rate held at
    # 3e-4 at step 6 (the last stable step of one 9-step schedule) then falling, 1-sqrt, towards 0.001 of it
    log = (decay / "train.log").read_text()
    assert f"continuing from {root / 'pretrain_context'}" in log and "resume.continue_from" in log
    rates = {**logged(context, "train/lr"), **logged(decay, "train/lr")}
    assert sorted(logged(context, "train/lr")) == list(range(6)) and sorted(logged(decay, "train/lr")) == [6, 7, 8]
    assert rates[2] == rates[5] == rates[6] == pytest.approx(3e-4) and rates[6] > rates[7] > rates[8] > 3e-7
    with open(root / "report" / "scores.csv", newline="") as handle:
        assert [row["task"] for row in csv.DictReader(handle)] == ["sst2"]
    again = subprocess.run([*COMMAND, "workflow.action=plan"], cwd=repo, env=workflow_env(repo), capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0 and "0 of 10 stages would run" in again.stdout, again.stdout + again.stderr
