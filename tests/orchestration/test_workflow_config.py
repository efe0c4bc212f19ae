"""Workflows as config: the shipped recipes compose into stages wired by their inputs, every way a workflow can be
wrong is said before anything runs or is submitted, and the hashes follow config changes downstream only."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import workflow as workflow_entry
from pipeline.orchestration.plan import build_plan, decide
from pipeline.orchestration.spec import WorkflowError, load_workflow


def _error_of(capsys, *argv: str) -> str:
    code = workflow_entry.main(list(argv))
    assert code == 2
    return capsys.readouterr().err


def test_shipped_workflows_compose_into_the_recipe(tmp_path):
    tiny = load_workflow(["+workflow=tiny", f"workflow.root={tmp_path}"])
    assert [s.name for s in tiny.stages] == ["prep_phase1", "prep_phase2", "pretrain_phase1", "pretrain_phase2",
                                             "export", "finetune_sst2", "report"]
    plans = build_plan(tiny)       # composes data_prep / train / finetune configs with each stage's overrides
    phase2 = plans["pretrain_phase2"].argv
    assert f"init_from_checkpoint={tmp_path}/pretrain_phase1/checkpoints/last.ckpt" in phase2
    assert f"data.path={tmp_path}/prep_phase2" in phase2 and "logger.group=tiny" in phase2
    assert f"init={tmp_path}/export" in plans["finetune_sst2"].argv
    for name in ("bert_base", "bert_large"):
        big = load_workflow([f"+workflow={name}", "workflow.corpus_root=/data/corpus", f"workflow.root={tmp_path}"])
        plans = build_plan(big)
        assert f"+experiment={name}" in plans["pretrain_phase1"].argv
        assert f"+experiment={name}_phase2" in plans["pretrain_phase2"].argv
        assert "trainer.devices=8" in plans["pretrain_phase1"].argv
        assert {"finetune_mnli", "finetune_rte"} <= set(plans)
        assert any(n.startswith("finetune_squad_v1") for n in plans)


@pytest.mark.parametrize("overrides, message", [
    ([], "which workflow? pass +workflow=NAME"),
    (["+workflow=nope"], "unknown workflow 'nope'"),
    (["+workflow=bert_base"], "workflow.corpus_root is not set"),
    (["+workflow=tiny", "workflow.stages.pretrain_phase1.inputs.shards=prep_phase3"],
     "input shards comes from stage 'prep_phase3', which is not in this workflow (unknown stage"),
    (["+workflow=tiny", "workflow.stages.pretrain_phase1.inputs.shards=pretrain_phase2"],
     "which runs later: no earlier stage produces it"),
    (["+workflow=tiny", "workflow.stages.export.inputs.checkpoint=prep_phase1"],
     "input checkpoint needs checkpoint, but stage prep_phase1 (data_prep) produces shards"),
    (["+workflow=tiny", "~workflow.stages.pretrain_phase1.inputs"], "needs input shards"),
    (["+workflow=tiny", "workflow.stages.export.entry=deploy"], "unknown entry 'deploy'"),
    (["+workflow=tiny", "workflow.downstream.tasks=[sst2,glue9]"], "unknown task(s) glue9"),
    (["+workflow=tiny", "workflow.launcher=kubernetes"], "workflow.launcher='kubernetes'"),
    (["+workflow=tiny", "workflow.stages.pretrain_phase1.overrides=['trainer.max_stepz=3']"],
     "stage pretrain_phase1 (train): Could not override 'trainer.max_stepz'"),
    (["+workflow=tiny", "workflow.stages.pretrain_phase1.overrides=['data.path=/elsewhere']"],
     "data.path is set by the workflow"),
    (["+workflow=tiny", "workflow.data_prep.runner=dask", "workflow.data_prep.dask.cluster=kubernetes"],
     "workflow.data_prep.dask.cluster='kubernetes': choose local or slurm"),
])
def test_a_wrong_workflow_is_refused_before_anything_runs(capsys, tmp_path, overrides, message):
    error = _error_of(capsys, *overrides, f"workflow.root={tmp_path / 'wf'}")
    assert message in error, error
    assert not (tmp_path / "wf").exists()          # nothing ran, nothing was written


def test_slurm_launcher_without_sbatch_is_refused_before_submitting(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    error = _error_of(capsys, "+workflow=tiny", "workflow.launcher=slurm", f"workflow.root={tmp_path / 'wf'}")
    assert "workflow.launcher=slurm, but sbatch and squeue is not on the PATH" in error
    assert not (tmp_path / "wf").exists()


def test_dask_runner_passes_data_preps_own_keys(tmp_path):
    from pipeline.orchestration.entries import stage_command

    wf = load_workflow(["+workflow=tiny", "workflow.data_prep.runner=dask", "workflow.data_prep.dask.cluster=slurm",
                        "workflow.data_prep.dask.workers=4", f"workflow.root={tmp_path}"])
    argv = stage_command(wf, wf.stage("prep_phase1"), "python").argv
    assert argv[-2:] == ("dask.cluster=slurm", "dask.workers=4")
    assert not any(a.startswith("--runner") for a in argv)


def test_a_changed_stage_reruns_with_its_dependents_only(tmp_path):
    from pipeline.orchestration import markers

    base = ["+workflow=tiny", f"workflow.root={tmp_path}"]
    wf = load_workflow(base)
    plans = build_plan(wf, check_configs=False)
    for name, plan in plans.items():    # as if every stage had finished
        Path(plan.output_dir).mkdir(parents=True, exist_ok=True)
        for f in plan.complete_when:
            Path(plan.output_dir, f).parent.mkdir(parents=True, exist_ok=True)
            Path(plan.output_dir, f).touch()
    for name, plan in plans.items():
        from pipeline.orchestration.plan import consumed_inputs
        markers.write_marker(wf.state_dir, name, markers.DONE, config_hash=plan.config_hash,
                             run_id=markers.new_run_id(), inputs_consumed=consumed_inputs(wf.state_dir, plan))
    assert {n for n, why in decide(wf, plans).items() if why} == {"report"}

    changed = load_workflow(base + ["workflow.stages.prep_phase2.overrides=['preset=sample','max_seq_length=256']"])
    changed_plans = build_plan(changed, check_configs=False)
    reasons = decide(changed, changed_plans)
    assert {n for n, why in reasons.items() if why} == {"prep_phase2", "pretrain_phase2", "export", "finetune_sst2",
                                                        "report"}
    assert reasons["prep_phase2"] == "its config or inputs changed"
    assert changed_plans["pretrain_phase1"].config_hash == plans["pretrain_phase1"].config_hash
    assert changed_plans["export"].config_hash != plans["export"].config_hash   # through its inputs' hashes

    # an input produced again (same config) makes its readers stale
    markers.write_marker(wf.state_dir, "export", markers.DONE, config_hash=plans["export"].config_hash,
                         run_id="again", inputs_consumed=consumed_inputs(wf.state_dir, plans["export"]))
    assert decide(wf, plans)["finetune_sst2"] == "an input was produced again since"


def test_load_workflow_error_type():
    with pytest.raises(WorkflowError, match="unknown workflow"):
        load_workflow(["+workflow=missing"])
