"""A real single-node SLURM (the `slurm_cluster` fixture of conftest.py) runs a 2-task Lightning DDP job; and
infra/slurm/train.sbatch passes what Lightning needs, and resumes every start from the run's newest checkpoint. The
requeue itself, on the real SLURM: test_slurm_requeue.py."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
INFRA = REPO_ROOT / "infra" / "slurm"


# ---------------------------------------------------------------------------------------------- the sbatch file

def _sbatch_directives(path: Path) -> dict[str, str]:
    directives = {}
    for line in path.read_text().splitlines():
        match = re.match(r"#SBATCH\s+--([\w-]+)(?:=(\S+))?", line)
        if match:
            directives[match.group(1)] = match.group(2) or ""
    return directives


def test_train_sbatch_is_valid_bash_with_the_directives_lightning_needs():
    script = INFRA / "train.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    directives = _sbatch_directives(script)
    for key in ("nodes", "ntasks-per-node", "gpus-per-node", "cpus-per-task", "signal", "requeue", "job-name"):
        assert key in directives, f"#SBATCH --{key} missing"
    assert directives["ntasks-per-node"] == directives["gpus-per-node"], "one task per GPU"
    assert directives["signal"] == "USR1@120"   # pipeline/core/cluster/requeue.py: SIGUSR1 asks for a requeue
    assert directives["job-name"] not in ("bash", "interactive")   # Lightning ignores SLURM for those names
    text = script.read_text()
    assert 'EXPERIMENT="${EXPERIMENT:-bert_large}"' in text
    assert 'srun --kill-on-bad-exit=1 python pipeline/train.py +experiment="${EXPERIMENT}"' in text
    assert "trainer.num_nodes=$SLURM_NNODES" in text and "trainer.devices=$SLURM_NTASKS_PER_NODE" in text
    assert "SLURM_JOB_ID" in text       # run dir fixed per job id: a requeued job finds its checkpoints


def _run_train_sbatch(tmp_path: Path, restart_count: int, own_checkpoint: bool, *args: str) -> list[str]:
    """train.sbatch under bash with a fake srun that records its arguments: what every task would run."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(parents=True, exist_ok=True)
    srun = fake_bin / "srun"
    srun.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    srun.chmod(0o755)
    run_dir = tmp_path / "outputs" / "slurm" / "bert-pretrain-77"
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    if own_checkpoint:
        import torch
        torch.save({"global_step": 5}, run_dir / "checkpoints" / "step0000005.ckpt")
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"PK\x03\x04 cut short")   # a torn write: not complete
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{fake_bin}:{env['PATH']}", SRUN_ARGS=str(tmp_path / "srun_args"), SLURM_SUBMIT_DIR=str(tmp_path),
               SLURM_JOB_ID="77", SLURM_JOB_NAME="bert-pretrain", SLURM_NNODES="4", SLURM_NTASKS_PER_NODE="8",
               SLURM_CPUS_PER_TASK="12", SLURM_JOB_NODELIST="gpu[01-04]", SLURM_RESTART_COUNT=str(restart_count),
               PYTHONPATH=str(REPO_ROOT), GLOO_SOCKET_IFNAME="eth0")   # 4 nodes: gloo's interface is named
    subprocess.run(["bash", str(INFRA / "train.sbatch"), "strategy=deepspeed_stage_2", *args],
                   env=env, check=True, capture_output=True, text=True)
    return (tmp_path / "srun_args").read_text().splitlines()


def test_train_sbatch_srun_command(tmp_path):
    assert _run_train_sbatch(tmp_path, 0, False) == [
        "--kill-on-bad-exit=1", "python", "pipeline/train.py", "+experiment=bert_large",
        "trainer.num_nodes=4", "trainer.devices=8", "hydra.run.dir=outputs/slurm/bert-pretrain-77",
        "strategy=deepspeed_stage_2", "ckpt_path=auto"]


def test_every_start_of_train_sbatch_resumes_from_the_runs_own_newest_checkpoint(tmp_path):
    """Whatever ended the previous try (requeued with or without the signal, a node failure): ckpt_path=auto. A
    ckpt_path= given at submission is where the run starts only while its directory holds no complete checkpoint
    (the first start; a restart before the first checkpoint)."""
    for restart in (0, 3):
        args = _run_train_sbatch(tmp_path / f"own{restart}", restart, True, "ckpt_path=/old/last.ckpt")
        assert args[-1] == "ckpt_path=auto" and "ckpt_path=/old/last.ckpt" not in args
        assert _run_train_sbatch(tmp_path / f"new{restart}", restart, False, "ckpt_path=/old/last.ckpt")[-1] == \
            "ckpt_path=/old/last.ckpt"
        assert _run_train_sbatch(tmp_path / f"none{restart}", restart, True)[-1] == "ckpt_path=auto"


# ---------------------------------------------------------------------------------------------- the cluster

# ---------------------------------------------------------------------------------------------- the job

@pytest.mark.slow
def test_sbatch_two_task_lightning_ddp_job(slurm_cluster, tmp_path):
    out = tmp_path / "ranks"
    job = tmp_path / "smoke.sbatch"
    # Same shape as infra/slurm/train.sbatch, on CPUs: Lightning needs --ntasks-per-node = devices, and a job
    # name other than bash/interactive, to treat the run as a SLURM job.
    job.write_text(f"""#!/bin/bash
#SBATCH --job-name=bert-slurm-smoke
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=00:10:00
#SBATCH --output={tmp_path}/slurm-%j.out
set -euo pipefail
export OMP_NUM_THREADS=1
srun {sys.executable} {INFRA / 'smoke_ddp.py'} --out {out}
""")
    submitted = slurm_cluster.run("sbatch", "--parsable", f"--chdir={REPO_ROOT}", str(job), check=True)
    job_id = submitted.stdout.strip().split(";")[0]

    state = slurm_cluster.wait_for_job(job_id)
    job_log = next(tmp_path.glob("slurm-*.out"), None)
    job_output = job_log.read_text(errors="replace")[-6000:] if job_log else "(no job output)"
    assert state == "COMPLETED", f"job {job_id} ended {state}\n{job_output}\n{slurm_cluster.logs()}"
    assert slurm_cluster.job_field(job_id, "ExitCode") == "0:0", job_output

    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["global_rank"] for r in ranks] == [0, 1]
    assert {r["world_size"] for r in ranks} == {2}
    assert {r["cluster_environment"] for r in ranks} == {"SLURMEnvironment"}
    assert {r["slurm_job_id"] for r in ranks} == {job_id}
    assert sorted(r["slurm_procid"] for r in ranks) == ["0", "1"]
    assert {r["backend"] for r in ranks} == {"gloo"}
    assert {r["requeue_group_ranks"] for r in ranks} == {2}      # the requeue's own gloo group reached both ranks
    assert {r["global_step"] for r in ranks} == {4}
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"], "DDP ranks diverged"
