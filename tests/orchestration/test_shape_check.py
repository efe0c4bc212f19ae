"""Every shipped workflow passes its stages' own pre-flight checks at the shape each stage declares (nodes x
processes), before anything runs; a stage that would fail at its start is refused at once, saying which and why."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.finetuning.tasks import get_task
from pipeline.orchestration.stage_config import compose_stage, environment, stage_specs
from pipeline.orchestration.workflow_config import WorkflowError, available_workflows, load_workflow


def _task_files(workflow, with_train: bool = True) -> None:
    """The files each downstream task reads, where its composed config looks for them (GLUE_DIR, SQUAD_DIR): the
    check is about the shape, and needs only that they exist."""
    for stage in workflow.stages:
        if stage.entry != "finetune":
            continue
        with environment(workflow.env):
            cfg = compose_stage(workflow, stage)
        task = get_task(str(cfg.task.name))
        directory = Path(cfg.data.dir)
        directory.mkdir(parents=True, exist_ok=True)
        for split in (*(("train",) if with_train else ()), *task.eval_splits):
            (directory / task.splits[split]).touch()


@pytest.fixture
def cluster_inputs(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    for folder, name in (("wikipedia", "enwiki-pages-articles1.xml.bz2"), ("bookcorpus", "book.txt")):
        (corpus / folder).mkdir(parents=True)
        (corpus / folder / name).touch()
    monkeypatch.setenv("WANDB_API_KEY", "test-key-for-the-mode-check")     # bert_base logs to W&B online
    (tmp_path / "tokenizer.json").write_text("{}")   # ModernBERT's workflows name one; counted by content only
    return ["workflow.corpus_root=" + str(corpus), f"workflow.env.GLUE_DIR={tmp_path / 'glue'}",
            f"workflow.env.SQUAD_DIR={tmp_path / 'squad'}", f"workflow.root={tmp_path / 'wf'}",
            f"workflow.tokenizer={tmp_path / 'tokenizer.json'}"]


TRAIN_SHAPES = {   # the processes of each pre-training stage, as the workflows declare them
    "bert_base": {"pretrain_phase1": 32, "pretrain_phase2": 32},
    "bert_large": {"pretrain_phase1": 64, "pretrain_phase2": 64},
    "modernbert_base": {"pretrain_phase1": 32, "pretrain_context": 32, "pretrain_decay": 32},
    "modernbert_large": {"pretrain_phase1": 32, "pretrain_context": 8, "pretrain_decay": 8},
}


@pytest.mark.parametrize("name", available_workflows())
def test_every_shipped_workflow_passes_its_stages_checks_at_their_declared_shape(name, cluster_inputs):
    inputs = cluster_inputs if name not in ("tiny", "modernbert_tiny") else cluster_inputs[1:]   # the bundled sample
    workflow = load_workflow([f"+workflow={name}", *inputs])
    _task_files(workflow)
    specs = stage_specs(workflow)          # raises on the first refusal
    shapes = {s.name: s.world_size for s in workflow.stages if s.entry == "train"}
    if name in TRAIN_SHAPES:
        assert shapes == TRAIN_SHAPES[name]
    assert {s.entry for s in specs.values()} >= {"data_prep", "train", "export", "finetune", "report"}


def test_modernbert_large_context_extension_on_four_nodes_is_refused_before_the_first_job(cluster_inputs):
    """Its batch of 616 (ModernBERT-large's) splits over 8 GPUs, not 32: refused before anything runs, naming both."""
    workflow = load_workflow(["+workflow=modernbert_large", *cluster_inputs,
                              "workflow.stages.pretrain_context.resources.nodes=4"])
    _task_files(workflow)
    with pytest.raises(WorkflowError, match=r"stage pretrain_context \(train\) refused at 4 node\(s\) x 8 "
                                            r"process\(es\): data.global_batch_size=616 does not divide over .* 32"):
        stage_specs(workflow)


def test_a_decay_stage_without_the_run_it_continues_is_refused(cluster_inputs):
    """The decay phase resumes its stable phase's last checkpoint (input `resume`); without it, it would decay from
    random weights: refused before anything runs."""
    workflow = load_workflow(["+workflow=modernbert_base", *cluster_inputs,
                              "~workflow.stages.pretrain_decay.inputs.resume"])
    _task_files(workflow)
    with pytest.raises(WorkflowError, match="stage pretrain_decay .* resume.continue_from"):
        stage_specs(workflow)


def test_a_batch_that_does_not_split_over_the_declared_gpus_is_refused(cluster_inputs):
    workflow = load_workflow(["+workflow=bert_base", *cluster_inputs,
                              "workflow.stages.pretrain_phase1.overrides=['+experiment=bert_base',"
                              "'data.global_batch_size=100']"])
    _task_files(workflow)
    with pytest.raises(WorkflowError, match=r"stage pretrain_phase1 \(train\) refused at 4 node\(s\) x 8 process\(es\)"
                                            r": .*100"):
        stage_specs(workflow)


def test_missing_task_data_is_refused_naming_the_variable_to_set(cluster_inputs):
    workflow = load_workflow(["+workflow=bert_base", *cluster_inputs[:1]])
    with pytest.raises(WorkflowError, match="stage finetune_cola .* set GLUE_DIR"):
        stage_specs(workflow)


def test_wandb_online_without_a_key_is_refused(cluster_inputs, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY")
    workflow = load_workflow(["+workflow=bert_base", *cluster_inputs])
    _task_files(workflow)
    with pytest.raises(WorkflowError, match="stage pretrain_phase1 .* WANDB_API_KEY"):
        stage_specs(workflow)


def test_a_phase_two_without_its_phase_one_is_refused(cluster_inputs):
    workflow = load_workflow(["+workflow=bert_base", *cluster_inputs, "~workflow.stages.pretrain_phase2.inputs.init"])
    with pytest.raises(WorkflowError, match="stage pretrain_phase2 .* init_from_checkpoint"):
        stage_specs(workflow)


def test_a_fine_tuning_batch_that_does_not_split_over_its_processes_is_refused(cluster_inputs):
    workflow = load_workflow(["+workflow=bert_base", *cluster_inputs, "workflow.downstream.resources.gpus_per_node=3"])
    _task_files(workflow)
    with pytest.raises(WorkflowError, match=r"stage finetune_cola \(finetune\) refused at 1 node\(s\) x 3 process\(es\)"
                                            r": data.batch_size=32 must be a positive multiple of .* 3"):
        stage_specs(workflow)


def test_an_evaluate_only_fine_tuning_stage_needs_no_training_file(cluster_inputs):
    evaluate = ("workflow.downstream.overrides=['trainer.accelerator=gpu','trainer.precision=bf16-mixed',"
                "'trainer.max_epochs=0']")
    workflow = load_workflow(["+workflow=bert_base", *cluster_inputs, evaluate])
    _task_files(workflow, with_train=False)
    stage_specs(workflow)
    workflow = load_workflow(["+workflow=bert_base", *cluster_inputs])
    with pytest.raises(WorkflowError, match="stage finetune_cola .* train data of task cola not found"):
        stage_specs(workflow)
