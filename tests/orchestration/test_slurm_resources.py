"""A stage's resources become the sbatch options the shipped recipes need: the SLURM executor's own submit-command
builder turns our rule resources into the sbatch line, checked here for the shapes of bert_base; the requeue
contract comes from infra/slurm/train.sbatch, where it is written once."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.orchestration.slurm_resources import megabytes, minutes, requeue_contract, rule_resources
from pipeline.orchestration.spec import load_workflow

snakemake_slurm = pytest.importorskip("snakemake_executor_plugin_slurm.submit_string")
from snakemake_executor_plugin_slurm.utils import set_gres_string  # noqa: E402
from snakemake_executor_plugin_slurm.validation import validate_slurm_extra  # noqa: E402


class _Resources(dict):
    """What the executor reads of a job's resources: .get() and attribute access, as Snakemake's Resources."""
    __getattr__ = dict.get


class _Job:
    def __init__(self, resources: dict):
        self.resources = _Resources(resources)
        self.threads = 1


def sbatch_line(resources: dict) -> str:
    """As the executor builds it (its run_job): options it refuses in slurm_extra fail here too."""
    job = _Job(resources)
    validate_slurm_extra(job)
    params = {"run_uuid": "bert_base-0123abcd_x", "slurm_logfile": "/logs/%j.log", "comment_str": "rule_x",
              "account": "", "partition": "", "workdir": "/repo"}
    return snakemake_slurm.get_submit_command(job, params) + set_gres_string(job)


def _stage_resources(tmp_path, name: str, **slurm) -> dict:
    wf = load_workflow(["+workflow=bert_base", "workflow.corpus_root=/c", f"workflow.root={tmp_path}"])
    import dataclasses
    stage = wf.stage(name)
    return rule_resources(dataclasses.asdict(stage.resources), stage.entry, {**wf.slurm, **slurm})


def test_multi_node_pretraining_gets_one_task_per_gpu_and_the_requeue_contract(tmp_path):
    resources = _stage_resources(tmp_path, "pretrain_phase1", partition="gpu", account="bert")
    assert resources["mpi"] == "srun" and resources["tasks_per_node"] == 8 and resources["nodes"] == 4
    line = sbatch_line(resources)
    for option in ("--nodes=4", "--ntasks-per-node=8", "--cpus-per-task=12", "--gpus-per-node=8", "--requeue",
                   "--open-mode=append", "--signal=USR1@120"):
        assert option in line.split(), (option, line)
    assert "-t 2880" in line and "--mem" not in line          # mem 0: no amount asked, the partition's default
    assert resources["slurm_partition"] == "gpu" and resources["slurm_account"] == "bert"


def test_a_one_gpu_downstream_task_is_a_plain_job_with_its_gpu(tmp_path):
    resources = _stage_resources(tmp_path, "finetune_mnli")
    assert "mpi" not in resources and resources["gpu"] == 1
    line = sbatch_line(resources)
    assert "--gpus=1" in line and "--mem 65536" in line and "--requeue" not in line and "-t 720" in line


def test_data_prep_asks_for_its_cpus_and_memory(tmp_path):
    line = sbatch_line(_stage_resources(tmp_path, "prep_phase1"))
    assert "--cpus-per-task=32" in line and "--mem 131072" in line and "--signal" not in line


def test_the_requeue_contract_is_read_from_train_sbatch(tmp_path):
    assert requeue_contract() == {"signal": "USR1@120", "requeue": "", "open-mode": "append"}
    other = tmp_path / "train.sbatch"
    other.write_text("#SBATCH --signal=USR1@300\n#SBATCH --requeue\n")
    with pytest.raises(ValueError, match="open-mode"):
        requeue_contract(other)


@pytest.mark.parametrize("time, expected", [("48:00:00", 2880), ("00:20:00", 20), ("1-12", 2160),
                                            ("7-00:00:00", 10080), ("90", 90), ("00:00:30", 1)])
def test_times_in_slurms_formats(time, expected):
    assert minutes(time) == expected


def test_memory_sizes():
    assert (megabytes("64G"), megabytes("500M"), megabytes("0"), megabytes("2T")) == (65536, 500, 0, 2097152)
    with pytest.raises(ValueError, match="give a size"):
        megabytes("lots")
