"""The tiny workflow on the real local SLURM (conftest.py's `slurm_cluster`): a stage made to fail stops its
dependents (SLURM cancels them), the status says which failed and where its log is, the report still runs; a
re-run skips what is done and completes the rest."""
from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest

from test_workflow_local import STAGES, run_workflow, stage_lines, workflow_env

WAIT_S = 900


def wait_for_empty_queue(cluster, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not cluster.run("squeue", "-h").stdout.strip():
            return
        time.sleep(3)
    raise TimeoutError(f"jobs still queued after {timeout_s} s:\n{cluster.run('squeue').stdout}\n{cluster.logs()}")


@pytest.mark.slow
def test_tiny_workflow_on_slurm_failure_stops_dependents_and_rerun_completes(slurm_cluster, tmp_path):
    root = tmp_path / "wf"
    env = {**workflow_env(), **{k: v for k, v in slurm_cluster.env.items() if k.startswith("SLURM")}}
    broken = "workflow.stages.pretrain_phase1.overrides=['trainer.max_steps=0']"   # train.py refuses: exit 1

    submitted = run_workflow(root, "workflow.launcher=slurm", broken, env=env)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert "pretrain_phase1" in submitted.stdout and "after" in stage_lines(submitted.stdout)["pretrain_phase2"][0]
    wait_for_empty_queue(slurm_cluster)

    status = run_workflow(root, "workflow.action=status", broken, env=env)
    lines = {name: text[0] for name, text in stage_lines(status.stdout).items()}
    assert lines["prep_phase1"].startswith("done") and lines["prep_phase2"].startswith("done"), status.stdout
    assert lines["pretrain_phase1"].startswith("failed") and "exit status 1; log: " in lines["pretrain_phase1"]
    log = Path(lines["pretrain_phase1"].split("log: ")[1])
    assert log.is_file() and "trainer.max_steps must be positive" in log.read_text()
    for dependent in ("pretrain_phase2", "export", "finetune_sst2"):
        assert lines[dependent].startswith("cancelled"), status.stdout
    stages = {row["stage"]: row["state"] for row in csv.DictReader(open(root / "report" / "stages.csv"))}
    assert stages["pretrain_phase1"] == "failed" and stages["finetune_sst2"] == "cancelled"   # report ran anyway

    rerun = run_workflow(root, "workflow.launcher=slurm", env=env)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    lines = stage_lines(rerun.stdout)
    assert lines["prep_phase1"] == ["skipped: done, same config and inputs"]
    assert lines["prep_phase2"] == ["skipped: done, same config and inputs"]
    assert all(lines[s][0].startswith("submitted as job") for s in STAGES[2:]), rerun.stdout
    assert "after" not in lines["pretrain_phase1"][0]     # its inputs are done: nothing to wait for
    wait_for_empty_queue(slurm_cluster)

    status = run_workflow(root, "workflow.action=status", env=env)
    states = {name: text[0].split()[0] for name, text in stage_lines(status.stdout).items()}
    assert all(states[s] == "done" for s in STAGES), status.stdout + slurm_cluster.logs()
    scores = list(csv.DictReader(open(root / "report" / "scores.csv")))
    assert [s["task"] for s in scores] == ["sst2"]
    stage_rows = {row["stage"]: row for row in csv.DictReader(open(root / "report" / "stages.csv"))}
    assert all(stage_rows[s]["state"] == "done" and stage_rows[s]["job"] for s in STAGES)
