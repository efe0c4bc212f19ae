"""A stage's identity (what Snakemake compares to decide whether it re-runs) follows what shapes its result: its
composed config minus one list of keys that shape nothing (identity.NOT_SHAPING, a test per key), and the content of
the files it reads from outside the workflow. Not the code: a comment edit changes no identity, only the recorded
code version."""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.orchestration import identity, runs
from pipeline.orchestration.stage_config import compose_stage, stage_specs
from pipeline.orchestration.workflow_config import load_workflow
from tests.helpers.workflows import copy_checkout

REPO_ROOT = Path(__file__).resolve().parents[2]
STAGE_OF = {"data_prep": "prep_phase1", "train": "pretrain_phase1", "finetune": "finetune_sst2"}


def _composed() -> dict[str, dict]:
    """Each entry point's config as bert_base composes it (no file is read or written)."""
    wf = load_workflow(["+workflow=bert_base", "workflow.root=/nonexistent/wf", "workflow.corpus_root=/nonexistent/c"])
    return {entry: OmegaConf.to_container(compose_stage(wf, wf.stage(name)), resolve=True)
            for entry, name in STAGE_OF.items()}


COMPOSED = _composed()
SHAPING = [(entry, key) for entry, config in COMPOSED.items() for key, _ in identity.leaves(config)
           if not any(key == k or key.startswith(f"{k}.") for k in identity.NOT_SHAPING[entry])]


def _identity(entry: str, config: dict, tmp_path: Path) -> str:
    return identity.identity_hash(identity.identity_document(entry, config, identity.Checksums(tmp_path / "c.json")))


def _changed(config: dict, key: str) -> dict:
    """Every leaf at or below `key` set to another value."""
    changed = copy.deepcopy(config)
    for leaf, value in identity.leaves(config):
        if leaf == key or leaf.startswith(f"{key}."):
            *path, last = leaf.split(".")
            node = changed
            for part in path:
                node = node[part]
            node[last] = (not value) if isinstance(value, bool) else (value + 1 if isinstance(value, (int, float))
                                                                     else [value, "x"] if isinstance(value, list)
                                                                     else f"{value}-changed")
    return changed


@pytest.mark.parametrize("entry, key", [(e, k) for e, keys in identity.NOT_SHAPING.items() if e in STAGE_OF
                                        for k in keys])
def test_a_key_that_shapes_nothing_re_runs_nothing(entry, key, tmp_path):
    config = COMPOSED[entry]
    assert any(leaf == key or leaf.startswith(f"{key}.") for leaf, _ in identity.leaves(config)), \
        f"{key} is not a key of the {entry} config: a stale name in identity.NOT_SHAPING"
    assert _identity(entry, _changed(config, key), tmp_path) == _identity(entry, config, tmp_path)


@pytest.mark.parametrize("entry, key", SHAPING)
def test_every_other_key_re_runs_its_stage(entry, key, tmp_path):
    config = COMPOSED[entry]
    assert _identity(entry, _changed(config, key), tmp_path) != _identity(entry, config, tmp_path)


def _identities(root, *overrides: str) -> dict[str, str]:
    wf = load_workflow(["+workflow=tiny", f"workflow.root={root}", *overrides])
    return {name: spec.identity for name, spec in stage_specs(wf, check_shapes=False).items()}


def test_operational_settings_change_no_identity(tmp_path):
    base = _identities(tmp_path)
    operational = _identities(
        tmp_path, "workflow.wandb.mode=offline", "workflow.wandb.group=another", "workflow.env.SQUAD_DIR=/data/squad",
        "workflow.data_prep.args=['--runner=DirectRunner','--direct_num_workers=2']",
        "workflow.downstream.overrides=['data.limit_train_examples=512','trainer.max_epochs=1',"
        "'trainer.enable_progress_bar=true','data.num_workers=2']")
    assert operational == base


def test_a_resized_pretraining_runs_again_its_data_stream_follows_the_ranks(tmp_path):
    """Each loader worker of each rank reads its own share of the epoch (tests/core/test_shaping_keys.py): two ranks
    train on other rows in each step than one."""
    base = _identities(tmp_path)
    resized = _identities(tmp_path, "workflow.stages.pretrain_phase1.resources.tasks_per_node=2")
    assert {name for name in base if base[name] != resized[name]} == {"pretrain_phase1"}


@pytest.mark.parametrize("key, shapes", [("data.num_workers", True), ("data.micro_batch_size", True),
                                         ("trainer.devices", True), ("trainer.num_nodes", True),
                                         ("model.compile", False), ("model.cuda_graphs", False),
                                         ("validation.path", False), ("validation.max_batches", False),
                                         ("validation.every_n_steps", False), ("trainer.accelerator", False)])
def test_pretraining_keys_count_as_they_shape_the_run(key, shapes, tmp_path):
    """Loader workers, the pass size and the devices change the data stream; compiling (other kernels, the same
    steps) and validation (its own generator, no dropout) do not change what the run trains."""
    config = COMPOSED["train"]
    assert (_identity("train", _changed(config, key), tmp_path) != _identity("train", config, tmp_path)) == shapes


def test_a_config_change_changes_that_stage_only(tmp_path):
    base = _identities(tmp_path)
    changed = _identities(tmp_path, "workflow.stages.pretrain_phase2.overrides=['trainer.max_steps=6',"
                                    "'scheduler.warmup_steps=1','data.global_batch_size=4','data.micro_batch_size=4',"
                                    "'data.max_seq_length=512','data.max_predictions_per_seq=80']")
    assert {name for name in base if base[name] != changed[name]} == {"pretrain_phase2"}
    # its readers re-run when what it made changed (its sentinel's content), not because their identity changed


def test_an_environment_variable_counts_for_the_stages_whose_config_reads_it(tmp_path):
    base = _identities(tmp_path)
    glue = _identities(tmp_path, "workflow.env.GLUE_DIR=/data/glue")    # sst2's data.dir: ${task_data_dir:GLUE_DIR,..}
    assert {name for name in base if base[name] != glue[name]} == {"finetune_sst2"}


def test_the_identity_document_says_what_changed(tmp_path):
    def wf(*o):
        return stage_specs(load_workflow(["+workflow=tiny", f"workflow.root={tmp_path}", *o]),
                           check_shapes=False)["finetune_sst2"].document
    old, new = wf(), wf("workflow.downstream.per_task.sst2=['optimizer.lr=1e-4']")
    assert identity.changed_keys(old, new) == ["config.optimizer.lr"]
    assert "logger" not in json.dumps(old["config"]).replace('"logger": {}', "")


IDENTITIES = ("import json; from pipeline.orchestration.workflow_config import load_workflow; "
              "from pipeline.orchestration.stage_config import stage_specs; "
              "wf = load_workflow(['+workflow=tiny', 'workflow.root=/nonexistent/wf']); "
              "specs = stage_specs(wf, check_shapes=False); "
              "print(json.dumps({n: [s.identity, s.code_version] for n, s in specs.items()}))")


def test_a_comment_in_the_code_changes_no_identity_only_the_code_version(tmp_path):
    repo = copy_checkout(tmp_path / "checkout")

    def identities():
        out = subprocess.run([sys.executable, "-c", IDENTITIES], cwd=repo, env={"PYTHONPATH": str(repo)},
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out.splitlines()[-1])

    before = identities()
    devices = repo / "pipeline" / "core" / "devices.py"
    devices.write_text(devices.read_text() + "\n# a comment\n")
    after = identities()
    assert {name: ids[0] for name, ids in after.items()} == {name: ids[0] for name, ids in before.items()}
    assert {name for name in after if after[name][1] != before[name][1]} == {"pretrain_phase1", "pretrain_phase2",
                                                                             "finetune_sst2"}


def test_external_inputs_count_by_content_not_by_path(tmp_path):
    vocab = tmp_path / "a" / "vocab.txt"
    vocab.parent.mkdir()
    shutil.copyfile(REPO_ROOT / "data_prep" / "vocab" / "bert-base-uncased-vocab.txt", vocab)
    glue = tmp_path / "glue" / "SST-2"
    shutil.copytree(REPO_ROOT / "pipeline" / "finetuning" / "sample_data" / "SST-2", glue)
    args = (f"workflow.env.GLUE_DIR={glue.parent}",)
    def vocab_of(path):
        return ("workflow.stages.prep_phase1.overrides=['preset=sample','dupe_factor=1','num_shards=2',"
                f"'vocab.file={path}']")
    base = _identities(tmp_path, vocab_of(vocab), *args)

    moved = tmp_path / "b" / "vocab.txt"
    moved.parent.mkdir()
    shutil.copyfile(vocab, moved)
    assert _identities(tmp_path, vocab_of(moved), *args) == base                  # the same content elsewhere
    vocab.write_text(vocab.read_text() + "[new_token]\n")
    changed = _identities(tmp_path, vocab_of(vocab), *args)
    assert {name for name in base if changed[name] != base[name]} == {"prep_phase1"}
    dev = glue / "dev.tsv"
    dev.write_text(dev.read_text().replace("\t1\n", "\t0\n", 1))                  # one label of the dev set
    changed = _identities(tmp_path, vocab_of(moved), *args)
    assert {name for name in base if changed[name] != base[name]} == {"finetune_sst2"}


def test_a_training_run_without_a_final_checkpoint_has_no_content_identity(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match="no final checkpoint"):
        runs.content_identity("train", tmp_path)


def test_the_code_version_covers_every_module_the_entry_point_imports():
    """The static import analysis misses nothing that running the entry point's modules imports."""
    probe = ("import sys; import pipeline.finetuning.run, pipeline.core.app; from pathlib import Path; "
             f"root = Path({str(REPO_ROOT)!r}); "
             "print('\\n'.join(sorted(str(Path(m.__file__).resolve().relative_to(root)) "
             "for m in list(sys.modules.values()) if getattr(m, '__file__', None) and Path(m.__file__).is_absolute() "
             "and Path(m.__file__).resolve().is_relative_to(root))))")
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                              cwd=REPO_ROOT).stdout.split()
    assert imported and set(imported) <= set(identity.code_files("finetune"))
    assert "pipeline/pretraining/run.py" not in identity.code_files("finetune")   # its own code only
    assert "pipeline/finetuning/run.py" not in identity.code_files("train")


def test_without_keys_drops_nested_keys_only():
    config = {"trainer": {"devices": 8, "max_steps": 3}, "logger": {"mode": "online"}, "seed": 1}
    assert identity.without_keys(config, ("trainer.devices", "logger")) == {"trainer": {"max_steps": 3}, "seed": 1}
