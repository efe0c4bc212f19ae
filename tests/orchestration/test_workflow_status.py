"""workflow.action=status from markers (and squeue), the SLURM launcher's jobs as sbatch receives them (a fake sbatch
records them), and the resume decision of an interrupted pre-training stage."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from pipeline.orchestration import markers
from pipeline.orchestration.plan import build_plan, consumed_inputs
from pipeline.orchestration.spec import load_workflow
from pipeline.orchestration.stage_job import prepare_training_dir

REPO_ROOT = Path(__file__).resolve().parents[2]


def _fake_slurm(bin_dir: Path, queue: str = "") -> Path:
    """sbatch that records its arguments and answers job ids 101, 102, ...; squeue that prints `queue`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    calls = bin_dir / "sbatch_calls"
    (bin_dir / "sbatch").write_text(f'#!/bin/bash\necho "$@" >> {calls}\nn=$(wc -l < {calls})\necho $((100 + n))\n')
    (bin_dir / "squeue").write_text(f"#!/bin/bash\nprintf '{queue}'\n")
    for tool in ("sbatch", "squeue"):
        (bin_dir / tool).chmod(0o755)
    return calls


def _workflow_command(root: Path, *extra: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
    return subprocess.run([sys.executable, "pipeline/workflow.py", "+workflow=tiny", f"workflow.root={root}", *extra],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_status_lists_done_running_pending_failed_with_job_ids_and_logs(tmp_path):
    root = tmp_path / "wf"
    calls = _fake_slurm(tmp_path / "bin", queue="205|RUNNING|None\n206|PENDING|Dependency\n")
    wf = load_workflow(["+workflow=tiny", f"workflow.root={root}"])
    plans = build_plan(wf, check_configs=False)
    done = plans["prep_phase1"]
    Path(done.output_dir).mkdir(parents=True)
    Path(done.output_dir, "manifest.json").write_text("{}")
    markers.write_marker(wf.state_dir, "prep_phase1", markers.DONE, config_hash=done.config_hash, run_id="r1",
                         inputs_consumed={}, wall_seconds=12.5, finished_at="2026-11-22T10:00:00+00:00")
    markers.write_marker(wf.state_dir, "prep_phase2", markers.FAILED, config_hash="x", job_id="204",
                         log="/logs/prep_phase2-204.out", reason="exit status 1")
    markers.write_marker(wf.state_dir, "pretrain_phase1", markers.RUNNING, config_hash="x", job_id="205")
    markers.write_marker(wf.state_dir, "pretrain_phase2", markers.SUBMITTED, config_hash="x", job_id="206")
    markers.write_marker(wf.state_dir, "export", markers.SUBMITTED, config_hash="x", job_id="207",
                         log="/logs/export-207.out")

    result = _workflow_command(root, "workflow.action=status", path=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[1:-1]}
    assert "done" in lines["prep_phase1"] and "12.5 s" in lines["prep_phase1"]
    assert "failed" in lines["prep_phase2"] and "exit status 1; log: /logs/prep_phase2-204.out" in lines["prep_phase2"]
    assert "running" in lines["pretrain_phase1"] and "job 205" in lines["pretrain_phase1"]
    assert "pending" in lines["pretrain_phase2"] and "job 206 pending, Dependency" in lines["pretrain_phase2"]
    # left the queue without starting, after a stage it needs failed: cancelled by SLURM (--kill-on-invalid-dep)
    assert "cancelled" in lines["export"] and "stage pretrain_phase2" not in lines["export"]
    assert "pending" in lines["finetune_sst2"] and "not run yet" in lines["finetune_sst2"]
    assert not calls.exists()          # status submits nothing


def test_slurm_launcher_submits_each_stage_after_its_inputs(tmp_path):
    root = tmp_path / "wf"
    calls = _fake_slurm(tmp_path / "bin")
    result = _workflow_command(root, "workflow.launcher=slurm", "workflow.downstream.tasks=[sst2,rte,mrpc]",
                               path=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert result.returncode == 0, result.stdout + result.stderr
    submitted = calls.read_text().splitlines()
    # prep 1 (101), prep 2 (102), phase 1 (103), phase 2 (104), export (105), the GLUE array (106), report (107)
    assert len(submitted) == 7, submitted
    assert "--dependency" not in submitted[0] and "--dependency" not in submitted[1]
    assert "--dependency=afterok:101 --kill-on-invalid-dep=yes" in submitted[2]
    assert "--dependency=afterok:102:103" in submitted[3]
    assert "--dependency=afterok:102:104" in submitted[4]          # export: phase 2, and prep 2 (the tokenizer)
    assert "--dependency=afterok:105" in submitted[5]
    assert "--dependency=afterany:101:102:103:104:105:106" in submitted[6]   # the report waits for everything

    jobs = root / "_workflow" / "jobs"
    phase1 = (jobs / "pretrain_phase1.sbatch").read_text()
    for directive in ("--signal=USR1@120", "--requeue", "--open-mode=append", "--job-name=tiny-pretrain_phase1"):
        assert f"#SBATCH {directive}" in phase1
    assert "--requeue" not in (jobs / "prep_phase1.sbatch").read_text()
    array = (jobs / "downstream.sbatch").read_text()
    assert "#SBATCH --array=0-2" in array and "STAGES=(finetune_sst2 finetune_rte finetune_mrpc)" in array
    assert markers.read_marker(root / "_workflow", "finetune_rte")["job_id"] == "106_1"

    status = _workflow_command(root, "workflow.action=status", "workflow.downstream.tasks=[sst2,rte,mrpc]", path=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    # the fake queue is empty: every job left it without writing a marker
    assert "prep_phase1      failed     job 101 left the queue before the stage started" in status.stdout
    assert "finetune_rte     cancelled  not run: stage export did not finish (job 106_1" in status.stdout


def _complete_checkpoint(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("data.pkl", b"x")


def test_an_interrupted_pretraining_resumes_from_its_checkpoint_only_for_the_same_config(tmp_path):
    wf = load_workflow(["+workflow=tiny", f"workflow.root={tmp_path}"])
    plan = build_plan(wf, check_configs=False)["pretrain_phase1"]
    inputs = consumed_inputs(wf.state_dir, plan)
    run_dir = Path(plan.output_dir)
    assert prepare_training_dir(plan, inputs, print) == []                   # first attempt: from scratch
    _complete_checkpoint(run_dir / "checkpoints" / "step0000010.ckpt")       # ... then killed at step 15
    assert prepare_training_dir(plan, inputs, print) == ["ckpt_path=last"]   # the re-run resumes
    (run_dir / "hpc_ckpt_1.ckpt").write_bytes(b"")                          # a requeue's checkpoint, too
    assert prepare_training_dir(plan, inputs, print) == ["ckpt_path=last"]

    other = build_plan(load_workflow(["+workflow=tiny", f"workflow.root={tmp_path}",
                                      "workflow.stages.pretrain_phase1.overrides=['trainer.max_steps=30']"]),
                       check_configs=False)["pretrain_phase1"]
    assert prepare_training_dir(other, inputs, print) == []                  # another config: starts afresh
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "hpc_ckpt_1.ckpt").exists()


def test_a_truncated_checkpoint_alone_is_not_resumed(tmp_path):
    wf = load_workflow(["+workflow=tiny", f"workflow.root={tmp_path}"])
    plan = build_plan(wf, check_configs=False)["pretrain_phase1"]
    inputs = consumed_inputs(wf.state_dir, plan)
    run_dir = Path(plan.output_dir)
    prepare_training_dir(plan, inputs, print)
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"PK\x03\x04 cut off")   # a copy killed half-way
    assert prepare_training_dir(plan, inputs, print) == []


def test_the_stage_process_decides_about_resuming_without_importing_torch():
    probe = "import sys, pipeline.orchestration.stage_job; print(sorted({'torch', 'pytorch_lightning'} & set(sys.modules)))"
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parents[2]).stdout.strip()
    assert imported == "[]"


def test_wandb_links_come_from_the_log_or_the_offline_run(tmp_path):
    from pipeline.orchestration.wandb_links import wandb_links

    log = tmp_path / "stage.log"
    log.write_text("wandb: View run bert_base_phase1 at: https://wandb.ai/team/bert-pretraining/runs/ab12cd34\n")
    assert wandb_links(tmp_path / "run", log) == ["https://wandb.ai/team/bert-pretraining/runs/ab12cd34"]
    (tmp_path / "run" / "wandb" / "offline-run-20261122_101010-xyz").mkdir(parents=True)
    links = wandb_links(tmp_path / "run", None)
    assert len(links) == 1 and links[0].startswith("offline: ") and "wandb sync" in links[0]
    assert wandb_links(tmp_path / "nothing", None) == []
