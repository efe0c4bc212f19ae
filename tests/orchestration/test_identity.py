"""A stage's identity (what Snakemake compares to decide whether it re-runs) follows what shapes its result, its
composed config and the code it runs, and nothing operational: W&B, progress bars, loader workers, devices, the
environment variables of other stages, where the checkout is."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipeline.orchestration import identity
from pipeline.orchestration.spec import load_workflow
from pipeline.orchestration.stages import stage_specs

REPO_ROOT = Path(__file__).resolve().parents[2]


def _identities(tmp_path, *overrides: str) -> dict[str, str]:
    wf = load_workflow(["+workflow=tiny", f"workflow.root={tmp_path}", *overrides])
    return {name: spec.identity for name, spec in stage_specs(wf, check_shapes=False).items()}


def test_operational_settings_change_no_identity(tmp_path):
    base = _identities(tmp_path)
    operational = _identities(
        tmp_path, "workflow.wandb.mode=offline", "workflow.wandb.group=another", "workflow.env.SQUAD_DIR=/data/squad",
        "workflow.data_prep.args=['--runner=DirectRunner','--direct_num_workers=2']",
        "workflow.stages.pretrain_phase1.resources.tasks_per_node=2",
        "workflow.downstream.overrides=['data.limit_train_examples=512','trainer.max_epochs=1',"
        "'trainer.enable_progress_bar=true','data.num_workers=2']")
    assert operational == base


def test_a_config_change_changes_that_stage_only(tmp_path):
    base = _identities(tmp_path)
    changed = _identities(tmp_path, "workflow.stages.pretrain_phase2.overrides=['trainer.max_steps=6',"
                                    "'scheduler.warmup_steps=1','data.global_batch_size=4','data.micro_batch_size=4',"
                                    "'data.max_seq_length=512','data.max_predictions_per_seq=80']")
    assert {name for name in base if base[name] != changed[name]} == {"pretrain_phase2"}
    # its readers re-run because it does (Snakemake), not because their identity changed


def test_an_environment_variable_counts_for_the_stages_whose_config_reads_it(tmp_path):
    base = _identities(tmp_path)
    glue = _identities(tmp_path, "workflow.env.GLUE_DIR=/data/glue")    # sst2's data.dir: ${task_data_dir:GLUE_DIR,..}
    assert {name for name in base if base[name] != glue[name]} == {"finetune_sst2"}


def test_the_identity_document_says_what_changed(tmp_path):
    wf = lambda *o: stage_specs(load_workflow(["+workflow=tiny", f"workflow.root={tmp_path}", *o]),
                                check_shapes=False)["finetune_sst2"].document
    old, new = wf(), wf("workflow.downstream.per_task.sst2=['optimizer.lr=1e-4']")
    assert identity.changed_keys(old, new) == ["config.optimizer.lr"]
    assert old["config"]["data"]["dir"] == "<repo>/pipeline/finetuning/sample_data/SST-2"   # not this checkout's path
    assert "logger" not in json.dumps(old["config"]).replace('"logger": {}', "")


def test_the_code_version_covers_every_module_the_entry_point_imports():
    """The static import analysis misses nothing that running the entry point's modules imports."""
    probe = ("import sys; import pipeline.finetuning.run, pipeline.core.app; from pathlib import Path; "
             f"root = Path({str(REPO_ROOT)!r}); "
             "print('\\n'.join(sorted(str(Path(m.__file__).resolve().relative_to(root)) for m in list(sys.modules.values())"
             " if getattr(m, '__file__', None) and Path(m.__file__).is_absolute() and Path(m.__file__).resolve().is_relative_to(root))))")
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                              cwd=REPO_ROOT).stdout.split()
    assert imported and set(imported) <= set(identity.code_files("finetune"))
    assert "pipeline/pretraining/run.py" not in identity.code_files("finetune")   # its own code only
    assert "pipeline/finetuning/run.py" not in identity.code_files("train")


def test_without_keys_drops_nested_keys_only():
    config = {"trainer": {"devices": 8, "max_steps": 3}, "logger": {"mode": "online"}, "seed": 1}
    assert identity.without_keys(config, ("trainer.devices", "logger")) == {"trainer": {"max_steps": 3}, "seed": 1}
