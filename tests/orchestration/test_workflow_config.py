"""Workflows as config: the shipped recipes compose into stages wired by their inputs, checked against the schema
(snakemake.utils.validate), and every way a workflow can be wrong is said before anything runs or is submitted; the
Snakefile passes `snakemake --lint`."""
from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline import workflow as workflow_entry
from pipeline.orchestration.stage_config import compose_stage, entry_argv, operational_overrides
from pipeline.orchestration.workflow_config import Stage, WorkflowError, load_workflow


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
        assert phase1.world_size == (32 if name == "bert_base" else 64)
        assert {"finetune_mnli", "finetune_rte"} <= {s.name for s in big.stages}
        assert any(s.name.startswith("finetune_squad_v1") for s in big.stages)


def test_the_command_of_a_stage_wires_its_inputs_run_directories(tmp_path):
    spec = Stage(name="pretrain_phase2", entry="train", inputs={"shards": "prep_phase2", "init": "pretrain_phase1"},
                 overrides=["trainer.max_steps=5"], operational=["logger.group=tiny"], env={}, identity="x",
                 document={}, resources={}, upstream=["prep_phase2", "pretrain_phase1"], code_version=None)
    argv = entry_argv(spec, {"shards": tmp_path / "p2" / "v1", "init": tmp_path / "t1" / "v2"}, tmp_path / "run")
    assert argv == ["pipeline/train.py", "trainer.max_steps=5", f"data.path={tmp_path}/p2/v1",
                    f"hydra.run.dir={tmp_path}/run", "ckpt_path=auto", "callbacks.checkpoint.save_last=true",
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
    (["+workflow=tiny", "workflow.stages.export.entry=deploy"], "workflow.stages.export.entry: 'deploy' is not one of"),
    (["+workflow=tiny", "workflow.downstream.tasks=[sst2,glue9]"], "unknown task(s) glue9"),
    (["+workflow=tiny", "workflow.launcher=kubernetes"], "workflow.launcher: 'kubernetes' is not one of ['local',"),
    (["+workflow=tiny", "workflow.action=deploy"], "workflow.action: 'deploy' is not one of ['run', 'plan',"),
    (["+workflow=tiny", "workflow.retries=-1"], "workflow.retries: -1 is less than the minimum of 0"),
    (["+workflow=tiny", "workflow.stages.pretrain_phase1.resources.nodes=0"],
     "workflow.stages.pretrain_phase1.resources.nodes: 0 is less than the minimum of 1"),
    (["+workflow=tiny", "workflow.stages.pretrain_phase1.resources.gpu=1"],
     "workflow.stages.pretrain_phase1.resources: Additional properties are not allowed ('gpu' was unexpected)"),
    (["+workflow=tiny", "workflow.stages.pretrain_phase1.resources.mem=lots"],
     "workflow.stages.pretrain_phase1.resources.mem: 'lots' does not match"),
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


def test_a_relative_root_is_taken_from_the_working_directory_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert load_workflow(["+workflow=tiny"]).root == tmp_path / "outputs" / "workflows" / "tiny"
    assert load_workflow(["+workflow=tiny", "workflow.root=link/wf"]).root == tmp_path / "real" / "wf"


def test_the_snakefile_passes_snakemake_lint(tmp_path):
    from pipeline.core.app import REPO_ROOT
    from pipeline.orchestration.launch import snakemake, write_launch
    from pipeline.orchestration.stage_config import stage_specs

    workflow = load_workflow(["+workflow=tiny", f"workflow.root={tmp_path / 'wf'}"])
    argv, env = snakemake(write_launch(workflow, stage_specs(workflow, check_shapes=False), REPO_ROOT, tmp_path),
                          "--lint")
    result = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0 and "Lints for" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert sys.executable == argv[0]
