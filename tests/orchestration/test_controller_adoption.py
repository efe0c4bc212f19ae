"""What reaches Snakemake's re-run decision, with the real Snakemake on the tiny workflow's rules (its records made
by `snakemake --touch`, sentinels and run records written as a stage job writes them):

- a stage re-runs its readers only when the content it made changed, not because it ran again (the sentinel holds
  the content identity, nothing of the run that made it);
- a controller started again adopts the stages whose jobs finished while no Snakemake watched (controller.adopt):
  it records them, with their current parameters and input checksums, so nothing of theirs runs again, and a later
  config change is still seen; a sentinel of another config makes its stage run again.
The SLURM tests cover the same on the local cluster with real stage jobs."""
from __future__ import annotations

import subprocess

import pytest

from pipeline.core.app import REPO_ROOT
from pipeline.orchestration import runs
from pipeline.orchestration.controller import adopt
from pipeline.orchestration.launch import snakemake, write_launch
from pipeline.orchestration.plan import dry_run
from pipeline.orchestration.stage_config import stage_specs
from pipeline.orchestration.stage_runner import read_inputs
from pipeline.orchestration.workflow_config import Stage, load_workflow

LONGER_PHASE1 = ("workflow.stages.pretrain_phase1.overrides=['trainer.max_steps=21','scheduler.warmup_steps=2',"
                 "'data.global_batch_size=8','data.micro_batch_size=8','data.num_workers=0']")
LONGER_PHASE2 = ("workflow.stages.pretrain_phase2.overrides=['trainer.max_steps=6','scheduler.warmup_steps=1',"
                 "'data.global_batch_size=4','data.micro_batch_size=4','data.max_seq_length=512',"
                 "'data.max_predictions_per_seq=80']")


def _launch(root, *overrides):
    workflow = load_workflow(["+workflow=tiny", f"workflow.root={root}", *overrides])
    config = write_launch(workflow, stage_specs(workflow, check_shapes=False), REPO_ROOT)
    return config, runs.read_json(config)


def _finish(root, launch, stage: str, content: str) -> None:
    """What a stage job leaves when it finishes: its run directory's record, `current`, the sentinel."""
    spec = Stage.from_dict(launch["stages"][stage])
    inputs = read_inputs(root, spec)
    run_dir = root / stage / runs.version_name(spec.identity, {r: i["content"] for r, i in inputs.items()})
    runs.write_json(run_dir / runs.RECORD, {"identity": spec.identity, "finished": runs.now(), "content": content})
    runs.point_current(root / stage, run_dir)
    runs.write_json(runs.sentinel_path(root, stage), {"content": content})


def _runs(config) -> set[str]:
    return {rule for rule, (_status, runs_again) in dry_run(config).items() if runs_again and rule != "report"}


@pytest.mark.slow
def test_readers_re_run_on_new_content_only_and_a_restarted_controller_adopts_what_finished(tmp_path):
    root = tmp_path / "wf"
    first, launch = _launch(root)
    stages = [name for name, stage in launch["stages"].items() if stage["entry"] != "report"]
    for name in stages:
        _finish(root, launch, name, f"{name}-1")
    # Snakemake's records, as after a launch that ran every stage
    argv, env = snakemake(first, "--touch", "--forceall", "--cores", "1")
    subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    assert _runs(first) == set()

    # A second launch runs phase 1 longer; its controller is killed, and its phase-1 job finishes unwatched with the
    # same final checkpoint (phase 1 had converged): a new run directory, the same content.
    second, launch2 = _launch(root, LONGER_PHASE1)
    assert {n for n in stages if launch2["stages"][n]["identity"] != launch["stages"][n]["identity"]} == \
        {"pretrain_phase1"}
    _finish(root, launch2, "pretrain_phase1", "pretrain_phase1-1")
    # Snakemake alone would run that finished stage again (its record holds the first launch's parameters), and so
    # everything after it
    assert _runs(second) == {"pretrain_phase1", "pretrain_phase2", "export", "finetune_sst2"}
    assert adopt(second) == []
    assert _runs(second) == set()                # adopted; its readers read the same content: nothing runs

    # ... or with another final checkpoint: what reads it runs
    _finish(root, launch2, "pretrain_phase1", "pretrain_phase1-2")
    assert adopt(second) == ["pretrain_phase2"]
    assert _runs(second) == {"pretrain_phase2", "export", "finetune_sst2"}
    for name in ("pretrain_phase2", "export", "finetune_sst2"):
        _finish(root, launch2, name, f"{name}-2")
    assert adopt(second) == [] and _runs(second) == set()

    # The adopted records still see a config change (the records are rewritten, never dropped)
    third, _ = _launch(root, LONGER_PHASE1, LONGER_PHASE2)
    assert _runs(third) == {"pretrain_phase2", "export", "finetune_sst2"}

    # A job of the first launch's phase 1 finishes last: its sentinel is of another config, which Snakemake would
    # take as done; the controller runs the stage again (it finds its finished run and hands on that content), and
    # phase 2, whose sentinel holds what it made from the other phase 1.
    _finish(root, launch, "pretrain_phase1", "pretrain_phase1-1")
    assert "pretrain_phase1" not in _runs(second)
    assert adopt(second) == ["pretrain_phase1", "pretrain_phase2"]
