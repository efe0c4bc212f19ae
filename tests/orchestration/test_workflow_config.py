"""Workflows as config: the shipped recipes compose into stages wired by their inputs, and every way a workflow can
be wrong is said before anything runs or is submitted."""
from __future__ import annotations

import pytest

from pipeline import workflow as workflow_entry
from pipeline.orchestration.spec import WorkflowError, load_workflow
from pipeline.orchestration.stages import StageSpec, compose_stage, entry_argv, operational_overrides


def _error_of(capsys, *argv: str) -> str:
    code = workflow_entry.main(list(argv))
    assert code == 2
    return capsys.readouterr().err


def test_shipped_workflows_compose_into_the_recipe(tmp_path):
    tiny = load_workflow(["+workflow=tiny", f"workflow.root={tmp_path}"])
    assert [s.name for s in tiny.stages] == ["prep_phase1", "prep_phase2", "pretrain_phase1", "pretrain_phase2",
                                             "export", "finetune_sst2", "report"]
    phase2 = tiny.stage("pretrain_phase2")
    assert phase2.inputs == {"shards": "prep_phase2", "init": "pretrain_phase1"}
    cfg = compose_stage(tiny, phase2)
    assert cfg.init_from_checkpoint == f"{tmp_path}/pretrain_phase1/current/checkpoints/last.ckpt"
    assert cfg.logger.group == "tiny" and cfg.data.max_seq_length == 512
    for name in ("bert_base", "bert_large"):
        big = load_workflow([f"+workflow={name}", "workflow.corpus_root=/data/corpus", f"workflow.root={tmp_path}"])
        phase1 = big.stage("pretrain_phase1")
        assert f"+experiment={name}" in phase1.overrides
        assert f"+experiment={name}_phase2" in big.stage("pretrain_phase2").overrides
        assert "trainer.devices=8" in operational_overrides(big, phase1)
        assert {"finetune_mnli", "finetune_rte"} <= {s.name for s in big.stages}
        assert any(s.name.startswith("finetune_squad_v1") for s in big.stages)


def test_the_command_of_a_stage_wires_its_inputs_run_directories(tmp_path):
    spec = StageSpec(name="pretrain_phase2", entry="train", inputs={"shards": "prep_phase2", "init": "pretrain_phase1"},
                     overrides=["trainer.max_steps=5"], operational=["logger.group=tiny"], env={}, identity="x",
                     document={}, resources={}, upstream=["prep_phase2", "pretrain_phase1"])
    argv = entry_argv(spec, {"shards": tmp_path / "p2" / "v1", "init": tmp_path / "t1" / "v2"}, tmp_path / "run")
    assert argv == ["pipeline/train.py", "trainer.max_steps=5", f"data.path={tmp_path}/p2/v1",
                    f"hydra.run.dir={tmp_path}/run", "ckpt_path=auto",
                    f"init_from_checkpoint={tmp_path}/t1/v2/checkpoints/last.ckpt", "logger.group=tiny"]


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
    (["+workflow=tiny", "workflow.action=deploy"], "workflow.action='deploy'"),
    (["+workflow=tiny", "workflow.retries=-1"], "workflow.retries=-1"),
    (["+workflow=tiny", "workflow.stages.pretrain_phase1.resources.nodes=0"], "resources.nodes=0"),
    (["+workflow=tiny", "workflow.stages.pretrain_phase1.overrides=['trainer.max_stepz=3']"],
     "stage pretrain_phase1 (train): Could not override 'trainer.max_stepz'"),
    (["+workflow=tiny", "workflow.stages.pretrain_phase1.overrides=['data.path=/elsewhere']"],
     "data.path is set by the workflow"),
    (["+workflow=tiny", "workflow.data_prep.args=['dask.clusterr=local']"], "stage prep_phase1 (data_prep)"),
    (["+workflow=tiny", "workflow.stages.pretrain_phase1.overrides=['trainer.max_steps=0']"],
     "stage pretrain_phase1 (train) refused at 1 node(s) x 1 process(es): trainer.max_steps must be positive"),
])
def test_a_wrong_workflow_is_refused_before_anything_runs(capsys, tmp_path, overrides, message):
    error = _error_of(capsys, "workflow.action=plan", f"workflow.root={tmp_path / 'wf'}", *overrides)
    assert message in error, error
    assert not (tmp_path / "wf").exists()          # nothing ran, nothing was written


def test_slurm_launcher_without_the_slurm_client_is_refused_before_anything_else(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    error = _error_of(capsys, "+workflow=tiny", "workflow.launcher=slurm", f"workflow.root={tmp_path / 'wf'}")
    assert "workflow.launcher=slurm, but sbatch, squeue, sacct not on the PATH" in error
    assert not (tmp_path / "wf").exists()


def test_environment_variables_are_added_without_a_plus(tmp_path):
    wf = load_workflow(["+workflow=tiny", "workflow.env.GLUE_DIR=/data/glue", f"workflow.root={tmp_path}"])
    assert wf.env == {"GLUE_DIR": "/data/glue"}


def test_load_workflow_error_type():
    with pytest.raises(WorkflowError, match="unknown workflow"):
        load_workflow(["+workflow=missing"])
