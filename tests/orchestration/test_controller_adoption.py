"""A controller started again (requeued, or launched after one was killed) finds sentinels that stage jobs wrote
while no Snakemake watched, and Snakemake's records of them stale (controller.adopt_sentinels). Here with the real
Snakemake on the tiny workflow's rules: its records made by `snakemake --touch`, the stage jobs' sentinels written
as a stage job writes them. The SLURM tests cover the same on the local cluster with real stage jobs."""
from __future__ import annotations

import subprocess

from pipeline.core.app import REPO_ROOT
from pipeline.orchestration import runs
from pipeline.orchestration.controller import adopt_sentinels
from pipeline.orchestration.launch import write_launch
from pipeline.orchestration.snakemake_cli import base_args, snakemake_env, summary
from pipeline.orchestration.spec import load_workflow
from pipeline.orchestration.stages import stage_specs

LONGER_PHASE1 = ("workflow.stages.pretrain_phase1.overrides=['trainer.max_steps=21','scheduler.warmup_steps=2',"
                 "'data.global_batch_size=8','data.micro_batch_size=8','data.num_workers=0']")


def _launch(root, *overrides):
    workflow = load_workflow(["+workflow=tiny", f"workflow.root={root}", *overrides])
    spec_path = write_launch(workflow, stage_specs(workflow, check_shapes=False))
    return workflow, spec_path, runs.read_json(spec_path)


def _finish(root, stage: str, identity: str) -> None:
    runs.write_json(runs.sentinel_path(root, stage), {"stage": stage, "identity": identity})


def _runs(workflow, spec_path) -> set[str]:
    return {rule for rule, (_status, runs_again) in summary(workflow, spec_path).items()
            if runs_again and rule != "report"}


def test_sentinels_written_while_no_snakemake_watched_are_adopted_or_run_again(tmp_path):
    root = tmp_path / "wf"
    first, first_spec, first_launch = _launch(root)
    identities = {name: stage["identity"] for name, stage in first_launch["stages"].items()
                  if stage["entry"] != "report"}
    for name, identity in identities.items():
        _finish(root, name, identity)
    # Snakemake's records, as after a launch that ran every stage
    subprocess.run([*base_args(first, first_spec), "--touch", "--forceall", "--cores", "1",
                    *(str(runs.sentinel_path(root, name)) for name in identities)],
                   env=snakemake_env(), cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert _runs(first, first_spec) == set()

    # A second launch runs phase 1 longer; its controller is killed, and its phase-1 job finishes unwatched.
    second, second_spec, second_launch = _launch(root, LONGER_PHASE1)
    changed = {name for name, identity in identities.items()
               if second_launch["stages"][name]["identity"] != identity}
    assert changed == {"pretrain_phase1"}
    _finish(root, "pretrain_phase1", second_launch["stages"]["pretrain_phase1"]["identity"])
    downstream = {"pretrain_phase2", "export", "finetune_sst2"}
    # Snakemake alone would run that finished stage again: its record holds the first launch's identity
    assert _runs(second, second_spec) == {"pretrain_phase1", *downstream}

    assert adopt_sentinels(second, second_spec, second_launch, snakemake_env()) == []
    assert _runs(second, second_spec) == downstream          # phase 1 done; what reads it runs

    # A job of the first launch's phase 1 finishes last: its sentinel is of another config. With no record left,
    # Snakemake would take it as done, so the controller forces the stage.
    _finish(root, "pretrain_phase1", identities["pretrain_phase1"])
    assert "pretrain_phase1" not in _runs(second, second_spec)
    assert adopt_sentinels(second, second_spec, second_launch, snakemake_env()) == ["pretrain_phase1"]
