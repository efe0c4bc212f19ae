"""The tiny workflow end to end on this machine (data prep x2, pre-training x2, export, SST-2, report), launched as the
README writes it (`python pipeline/workflow.py +workflow=tiny` from the repository root, so its default root,
relative, is resolved once), then what a user does next, each checked by Snakemake's own decision
(workflow.action=plan) and by what the run leaves:

- the second run does nothing; W&B's mode, an environment variable no stage reads, a memory-only knob re-run nothing;
- an edit of the fine-tuning task's YAML file re-runs that fine-tuning and the report only;
- a comment in the code re-runs nothing (plan says the code changed); workflow.rerun_code_changed=[stage] re-runs
  that stage in a new run directory; a changed package version is shown;
- a changed pre-training config runs in a new run directory and leaves the old one whole.
"""
from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest

from tests.helpers.workflows import STAGES

PHASE1 = ["trainer.max_steps=20", "scheduler.warmup_steps=2", "data.global_batch_size=8", "data.num_workers=0",
          "trainer.log_every_n_steps=5", "callbacks.checkpoint.every_n_train_steps=10",
          "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false"]


def _tree(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file under a run directory with its size and modification time."""
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _run_records(stage_dir: Path) -> list[Path]:
    """workflow_stage.json of each run directory of a stage (not through `current`, the link to the newest)."""
    return [r for r in stage_dir.glob("*/workflow_stage.json") if not r.parent.is_symlink()]


def _attempts(root: Path) -> dict[str, int]:
    return {stage: sum(len(json.loads(r.read_text())["attempts"]) for r in _run_records(root / stage))
            for stage in STAGES}


def _run_dir(root: Path, stage: str) -> Path:
    return (root / stage / "current").resolve()


@pytest.mark.slow
def test_tiny_workflow_runs_locally_and_reruns_exactly_what_changed(readme_workflow):
    wf, root = readme_workflow, readme_workflow.root
    started = time.perf_counter()
    first = wf.run()
    print(f"first run: {time.perf_counter() - started:.0f} s")
    assert first.returncode == 0, first.stdout + first.stderr
    assert root == wf.repo / "outputs" / "workflows" / "tiny" and (root / "report" / "scores.csv").is_file()
    for stage in STAGES:
        assert json.loads((root / stage / "DONE.json").read_text()) == \
            {"content": json.loads((_run_dir(root, stage) / "workflow_stage.json").read_text())["content"]}
    phase1 = _run_dir(root, "pretrain_phase1")
    assert f"init_from_checkpoint={phase1}/checkpoints/last.ckpt" in \
        (_run_dir(root, "pretrain_phase2") / "stage.log").read_text()
    assert (_run_dir(root, "export") / "model.safetensors").is_file()
    scores = list(csv.DictReader(open(root / "report" / "scores.csv")))
    assert [(s["task"], s["metric"]) for s in scores] == [("sst2", "acc")] and 0 <= float(scores[0]["score"]) <= 1
    for picture in ("scores.png", "curves-pretrain_phase1.png", "curves-pretrain_phase2.png"):
        assert (root / "report" / picture).stat().st_size > 1000
    attempts = _attempts(root)
    assert attempts == dict.fromkeys(STAGES, 1)
    report = wf.run("workflow.action=report")
    assert report.returncode == 0, report.stdout + report.stderr
    html = (root / "report" / "workflow.html").read_text(errors="replace")
    assert "curves-pretrain_phase2.png" in html and "scores.png" in html and "finetune_sst2" in html

    again = wf.run()
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stdout
    assert _attempts(root) == attempts

    operational = ("workflow.wandb.mode=offline", "workflow.env.SQUAD_DIR=/nonexistent/squad",
                   "workflow.downstream.overrides=['data.limit_train_examples=512','trainer.max_epochs=1',"
                   "'trainer.enable_progress_bar=true']",
                   "workflow.stages.pretrain_phase1.overrides="
                   f"{[*PHASE1, 'data.micro_batch_size=8', 'data.pad_to_multiple_of=16', 'model.compile=true']}")
    plan = wf.plan(*operational)
    assert all(plan[stage].startswith("skip: done") for stage in STAGES), plan
    assert wf.run(*operational).returncode == 0 and _attempts(root) == attempts

    task_yaml = wf.repo / "conf" / "training" / "task" / "sst2.yaml"
    old_finetune = _run_dir(root, "finetune_sst2")
    task_yaml.write_text(task_yaml.read_text() + "\noptimizer:\n  lr: 5.0e-05\n")
    plan = wf.plan()
    assert plan["finetune_sst2"] == ("run: params changed; config changed since it ran: config.optimizer.lr (a new "
                                     f"run directory; {old_finetune} is kept)"), plan
    assert plan["report"].startswith("run:") and all(plan[s].startswith("skip") for s in STAGES[:-1]), plan
    assert wf.run().returncode == 0
    assert _attempts(root) == {**attempts, "finetune_sst2": 2}
    assert _run_dir(root, "finetune_sst2") != old_finetune and (old_finetune / "metrics.json").is_file()

    # A comment in the code every Lightning stage imports: nothing re-runs; plan says so, and how to re-run one; and
    # a package version that differs from the one a stage ran with
    devices = wf.repo / "pipeline" / "core" / "devices.py"
    devices.write_text(devices.read_text() + "\n# a comment\n")
    record_path = _run_dir(root, "export") / "workflow_stage.json"
    record = json.loads(record_path.read_text())
    record["packages"]["torch"] = "0.0"
    record_path.write_text(json.dumps(record))
    plan = wf.plan()
    assert all(plan[s].startswith("skip: done") for s in STAGES), plan
    assert "code changed since it ran" in plan["pretrain_phase1"] and "code changed" not in plan["export"], plan
    assert "workflow.rerun_code_changed=[finetune_sst2]" in plan["finetune_sst2"], plan
    assert "packages changed since it ran: torch 0.0 -> " in plan["export"], plan
    assert wf.run().returncode == 0 and _attempts(root) == {**attempts, "finetune_sst2": 2}
    finetune = _run_dir(root, "finetune_sst2")
    assert wf.run("workflow.rerun_code_changed=[finetune_sst2]").returncode == 0
    assert _attempts(root) == {**attempts, "finetune_sst2": 3}
    assert _run_dir(root, "finetune_sst2") != finetune and (finetune / "metrics.json").is_file()
    assert wf.plan("workflow.rerun_code_changed=[finetune_sst2]")["finetune_sst2"].startswith("skip: done")

    old_phase2 = _run_dir(root, "pretrain_phase2")
    before = _tree(old_phase2)
    longer = ("workflow.stages.pretrain_phase2.overrides=['trainer.max_steps=6','scheduler.warmup_steps=1',"
              "'data.global_batch_size=4','data.micro_batch_size=4','data.max_seq_length=512',"
              "'data.max_predictions_per_seq=80','data.num_workers=0','trainer.log_every_n_steps=1',"
              "'callbacks.checkpoint.every_n_train_steps=5','trainer.enable_progress_bar=false']")
    plan = wf.plan(longer)
    assert [s for s in STAGES if plan[s].startswith("run")] == ["pretrain_phase2", "export", "finetune_sst2"], plan
    assert "config.trainer.max_steps" in plan["pretrain_phase2"]
    assert wf.run(longer).returncode == 0
    new_phase2 = _run_dir(root, "pretrain_phase2")
    assert new_phase2 != old_phase2
    assert _tree(old_phase2) == before            # the old run, checkpoints and all, untouched
    assert json.loads((new_phase2 / "workflow_stage.json").read_text())["document"]["config"]["trainer"][
        "max_steps"] == 6


def _wandb_runs(run_dir: Path) -> list[tuple[str, str]]:
    """(run id, group) of each W&B run written offline in a run directory, oldest first."""
    from tests.helpers.wandb_log import read_wandb_records

    found = []
    for log in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        run = next(r.run for r in read_wandb_records(log) if r.WhichOneof("record_type") == "run")
        found.append((run.run_id, run.run_group))
    return found


@pytest.mark.slow
def test_a_second_launch_is_refused_ctrl_c_stops_everything_and_the_relaunch_resumes(tiny_workflow):
    """Phase 1 is interrupted after its first checkpoint; meanwhile a second launch is refused; the relaunch
    continues it in the same run directory, from that checkpoint, in the same W&B run."""
    wf, root = tiny_workflow, tiny_workflow.root
    up_to_phase1 = ("~workflow.stages.pretrain_phase2", "~workflow.stages.export", "workflow.downstream.tasks=[]",
                    "workflow.report=false", "workflow.wandb.mode=offline",
                    "workflow.stages.pretrain_phase1.overrides=['trainer.max_steps=60','scheduler.warmup_steps=2',"
                    "'data.global_batch_size=8','data.micro_batch_size=8','data.num_workers=0',"
                    "'callbacks.checkpoint.every_n_train_steps=5','trainer.enable_progress_bar=false']")
    log = root.parent / "first.log"
    first = wf.start(*up_to_phase1, log=log)
    try:
        deadline = time.monotonic() + 1200
        while not list(root.glob("pretrain_phase1/*/checkpoints/step*.ckpt")):
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        second = wf.run(*up_to_phase1)
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"is already running: a local run, pid {first.pid} on" in second.stderr, second.stderr
    finally:
        import os
        import signal
        os.killpg(first.pid, signal.SIGINT)        # Ctrl-C in the terminal: its whole process group
        first.wait(timeout=600)
    assert first.returncode != 0, log.read_text()
    status = wf.status(*up_to_phase1)
    assert status["pretrain_phase1"].startswith("failed"), status
    (run_dir,) = _run_records(root / "pretrain_phase1")
    run_dir = run_dir.parent
    (wandb_run, group), = _wandb_runs(run_dir)
    assert group == "tiny"
    plan = wf.plan(*up_to_phase1)
    assert plan["pretrain_phase1"] == f"run: missing; its run {run_dir} did not finish: it resumes there", plan

    assert wf.run(*up_to_phase1).returncode == 0
    assert _run_dir(root, "pretrain_phase1") == run_dir
    assert len(json.loads((run_dir / "workflow_stage.json").read_text())["attempts"]) == 2
    assert "resuming from" in (run_dir / "train.log").read_text()
    assert [r for r, _ in _wandb_runs(run_dir)] == [wandb_run, wandb_run]    # one W&B run, one curve
