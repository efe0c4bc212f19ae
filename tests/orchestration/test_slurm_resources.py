"""A stage's resources become the sbatch options the shipped recipes need: the SLURM executor's own submit-command
builder (slurm.sbatch_line, which `plan` prints) turns our rule resources into the sbatch line, checked here
for the shapes of bert_base; the requeue contract comes from infra/slurm/train.sbatch, where it is written once, and
the executor's profile agrees with it. What the workflow config adds (a reservation, extra options) reaches sbatch
whole through the executor's shell command line, or is refused."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.orchestration import slurm
from pipeline.orchestration.slurm import megabytes, minutes, requeue_contract, rule_resources, sbatch_line
from pipeline.orchestration.workflow_config import WorkflowError, load_workflow

PROFILE = Path(__file__).resolve().parents[2] / "pipeline" / "orchestration" / "profiles" / "slurm" / "config.yaml"
pytest.importorskip("snakemake_executor_plugin_slurm.submit_string")
from snakemake_executor_plugin_slurm.validation import validate_slurm_extra  # noqa: E402


def _line(tmp_path, name: str, *overrides: str) -> tuple[dict, str]:
    wf = load_workflow(["+workflow=bert_base", "workflow.corpus_root=/c", f"workflow.root={tmp_path}", *overrides])
    stage = wf.stage(name)
    resources = rule_resources(stage.resources, stage.entry, wf.slurm)
    validate_slurm_extra(type("Job", (), {"resources": type("R", (dict,), {"__getattr__": dict.get})(resources)}))
    return resources, sbatch_line(resources)


def test_multi_node_pretraining_gets_one_task_per_gpu_and_the_requeue_contract(tmp_path):
    resources, line = _line(tmp_path, "pretrain_phase1", "workflow.slurm.partition=gpu", "workflow.slurm.account=bert")
    assert resources["mpi"] == "srun" and resources["tasks_per_node"] == 8 and resources["nodes"] == 4
    for option in ("--nodes=4", "--ntasks-per-node=8", "--cpus-per-task=12", "--gpus-per-node=8", "--requeue",
                   "--open-mode=append", "--signal=USR1@120", "-p", "gpu", "-A", "bert"):
        assert option in line.split(), (option, line)
    assert "-t 2880" in line


def test_a_one_process_pretraining_gets_the_requeue_signal_too(tmp_path):
    resources, line = _line(tmp_path, "pretrain_phase1", "workflow.stages.pretrain_phase1.resources.gpus_per_node=1",
                            "workflow.stages.pretrain_phase1.resources.nodes=1")
    # the executor's `mpi` key, empty: a plain one-task job whose Snakemake stays out of the stage's own job step
    assert resources["mpi"] == "" and resources["gpu"] == 1
    for option in ("--nodes=1", "--cpus-per-task=12", "--requeue", "--signal=USR1@120", "--gpus=1"):
        assert option in line.split(), (option, line)


def test_a_one_gpu_downstream_task_is_a_plain_job_with_its_gpu(tmp_path):
    resources, line = _line(tmp_path, "finetune_mnli")
    assert resources["gpu"] == 1
    assert "--gpus=1" in line and "--mem 65536" in line and "--signal" not in line and "-t 720" in line


def test_data_prep_asks_for_its_cpus_and_memory(tmp_path):
    _, line = _line(tmp_path, "prep_phase1")
    assert "--cpus-per-task=32" in line and "--mem 131072" in line and "--signal" not in line


def test_qos_constraint_reservation_and_partition_pass_through(tmp_path):
    _, line = _line(tmp_path, "finetune_rte", "workflow.slurm.qos=high", "workflow.slurm.constraint=a100",
                    "workflow.slurm.reservation=maintenance", "workflow.downstream.resources.slurm_partition=short",
                    "workflow.downstream.resources.qos=low")
    for option in ("--qos=low", "-C a100", "--reservation=maintenance", "-p short"):
        assert option in line, (option, line)


def test_the_requeue_contract_is_read_from_train_sbatch(tmp_path):
    assert requeue_contract() == {"signal": "USR1@120", "requeue": "", "open-mode": "append"}
    other = tmp_path / "train.sbatch"
    other.write_text("#SBATCH --signal=USR1@300\n#SBATCH --requeue\n")
    with pytest.raises(ValueError, match="open-mode"):
        requeue_contract(other)


@pytest.mark.parametrize("time, expected", [("48:00:00", 2880), ("00:20:00", 20), ("1-12", 2160),
                                            ("7-00:00:00", 10080), ("90", 90), ("00:00:30", 1), ("10:30", 11)])
def test_times_in_slurms_formats(time, expected):
    assert minutes(time) == expected


def test_memory_sizes():
    assert (megabytes("64G"), megabytes("500M"), megabytes("0"), megabytes("2T")) == (65536, 500, 0, 2097152)
    with pytest.raises(ValueError, match="give a size"):
        megabytes("lots")


def test_the_executor_leaves_a_node_failure_to_slurm_as_the_stage_jobs_ask(tmp_path, monkeypatch):
    """Pre-training jobs may be requeued (train.sbatch's --requeue): SLURM requeues one whose node failed. The executor
    must then wait for it, not count NODE_FAIL as a failure and submit the stage again beside it."""
    profile = yaml.safe_load(PROFILE.read_text())
    assert "requeue" in requeue_contract()
    assert profile.get("slurm-requeue") is True and not profile.get("slurm-no-requeue"), profile
    wf = load_workflow(["+workflow=bert_base", "workflow.corpus_root=/c", f"workflow.root={tmp_path}"])
    for stage in wf.stages[:-1]:                        # every stage job (the report runs in the controller)
        assert "--requeue" in sbatch_line(rule_resources(stage.resources, stage.entry, wf.slurm)).split(), stage.name
    monkeypatch.setattr(slurm, "EXECUTOR_PROFILE", tmp_path / "profile.yaml")
    (tmp_path / "profile.yaml").write_text("executor: slurm\n")
    stage = wf.stage("pretrain_phase1")
    with pytest.raises(WorkflowError, match="does not set slurm-requeue: true"):
        rule_resources(stage.resources, stage.entry, wf.slurm)


def test_a_reservation_and_extra_options_reach_sbatch_whole_through_the_shell(tmp_path):
    reservation = "maint window; touch injected; true"
    wf = load_workflow(["+workflow=bert_base", "workflow.corpus_root=/c", f"workflow.root={tmp_path}",
                        f"workflow.slurm.reservation='{reservation}'", "workflow.slurm.extra_args=['--begin=now+1hour',"
                        "'--mail-user=a b@example.org']"])
    stage = wf.stage("pretrain_phase1")
    line = sbatch_line(rule_resources(stage.resources, stage.entry, wf.slurm))
    # the executor runs its sbatch command through a shell (subprocess with shell=True): here with sbatch's arguments
    # printed instead
    printed = subprocess.run(f"{sys.executable} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' {line}",
                             shell=True, cwd=tmp_path, capture_output=True, text=True)
    assert not (tmp_path / "injected").exists()
    arguments = json.loads(printed.stdout.splitlines()[0])
    assert f"--reservation={reservation}" in arguments and "--mail-user=a b@example.org" in arguments, arguments
    assert "--begin=now+1hour" in arguments and "--signal=USR1@120" in arguments


@pytest.mark.parametrize("setting, refusal", [
    ("workflow.slurm.extra_args=['--exclusive --gres=gpu:1']",
     r"extra_args\[0\]: '--exclusive --gres=gpu:1' is not one sbatch option; give one option per item"),
    ("workflow.slurm.extra_args=[exclusive]", r"extra_args\[0\]: 'exclusive' is not one sbatch option"),
    ("workflow.slurm.reservation='maint\nrm -rf x'", r"workflow.slurm.reservation: .* holds a control character"),
])
def test_sbatch_values_that_cannot_be_passed_whole_are_refused(tmp_path, setting, refusal):
    with pytest.raises(WorkflowError, match=refusal):
        load_workflow(["+workflow=tiny", f"workflow.root={tmp_path}", setting])
