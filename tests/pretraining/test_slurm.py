"""A real single-node SLURM (the `slurm_cluster` fixture of conftest.py) runs a 2-task Lightning DDP job, and
requeues and resumes it on USR1; and infra/slurm/train.sbatch passes what Lightning needs."""
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
    assert directives["signal"] == "USR1@120"              # Lightning's auto-requeue handler listens for SIGUSR1
    assert directives["job-name"] not in ("bash", "interactive")   # Lightning ignores SLURM for those names
    text = script.read_text()
    assert 'EXPERIMENT="${EXPERIMENT:-bert_large}"' in text
    assert 'srun --kill-on-bad-exit=1 python pipeline/train.py +experiment="${EXPERIMENT}"' in text
    assert "trainer.num_nodes=$SLURM_NNODES" in text and "trainer.devices=$SLURM_NTASKS_PER_NODE" in text
    assert "SLURM_JOB_ID" in text       # run dir fixed per job id: a requeued job finds its hpc_ckpt


def _run_train_sbatch(tmp_path: Path, restart_count: int, hpc_checkpoint: bool) -> list[str]:
    """train.sbatch under bash with a fake srun that records its arguments: what every task would run."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(parents=True, exist_ok=True)
    srun = fake_bin / "srun"
    srun.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    srun.chmod(0o755)
    run_dir = tmp_path / "outputs" / "slurm" / "bert-pretrain-77"
    run_dir.mkdir(parents=True, exist_ok=True)
    if hpc_checkpoint:
        (run_dir / "hpc_ckpt_1.ckpt").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{fake_bin}:{env['PATH']}", SRUN_ARGS=str(tmp_path / "srun_args"), SLURM_SUBMIT_DIR=str(tmp_path),
               SLURM_JOB_ID="77", SLURM_JOB_NAME="bert-pretrain", SLURM_NNODES="4", SLURM_NTASKS_PER_NODE="8",
               SLURM_CPUS_PER_TASK="12", SLURM_JOB_NODELIST="gpu[01-04]", SLURM_RESTART_COUNT=str(restart_count))
    subprocess.run(["bash", str(INFRA / "train.sbatch"), "strategy=deepspeed_stage_2", "ckpt_path=/old/last.ckpt"],
                   env=env, check=True, capture_output=True, text=True)
    return (tmp_path / "srun_args").read_text().splitlines()


def test_train_sbatch_srun_command(tmp_path):
    assert _run_train_sbatch(tmp_path, restart_count=0, hpc_checkpoint=False) == [
        "--kill-on-bad-exit=1", "python", "pipeline/train.py", "+experiment=bert_large",
        "trainer.num_nodes=4", "trainer.devices=8", "hydra.run.dir=outputs/slurm/bert-pretrain-77",
        "strategy=deepspeed_stage_2", "ckpt_path=/old/last.ckpt"]


def test_requeued_train_sbatch_resumes_from_its_hpc_checkpoint_not_the_submitted_ckpt_path(tmp_path):
    args = _run_train_sbatch(tmp_path, restart_count=1, hpc_checkpoint=True)
    assert "ckpt_path=/old/last.ckpt" not in args and "strategy=deepspeed_stage_2" in args
    # requeued before any hpc checkpoint was written (e.g. a node failure): keep the submitted ckpt_path
    assert "ckpt_path=/old/last.ckpt" in _run_train_sbatch(tmp_path / "b", restart_count=1, hpc_checkpoint=False)


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
    assert {r["global_step"] for r in ranks} == {4}
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"], "DDP ranks diverged"


@pytest.mark.slow
def test_usr1_saves_hpc_checkpoint_requeues_and_the_restarted_job_resumes(slurm_cluster, tmp_path):
    """What infra/slurm/README.md promises: SIGUSR1 (from --signal=USR1@120 before the time limit; here sent at
    once with scancel) makes Lightning save hpc_ckpt_1.ckpt and requeue the job; the restarted job (same id, same
    run directory) resumes from it and finishes."""
    out, root = tmp_path / "ranks", tmp_path / "run"
    job = tmp_path / "requeue.sbatch"
    job.write_text(f"""#!/bin/bash
#SBATCH --job-name=bert-slurm-requeue
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=00:10:00
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output={tmp_path}/slurm-%j.out
set -euo pipefail
export OMP_NUM_THREADS=1
srun {sys.executable} {INFRA / 'smoke_ddp.py'} --out {out} --root-dir {root} --steps 12 --step-sleep 0.4
""")
    submitted = slurm_cluster.run("sbatch", "--parsable", f"--chdir={REPO_ROOT}", str(job), check=True)
    job_id = submitted.stdout.strip().split(";")[0]

    def job_output() -> str:
        log = next(tmp_path.glob("slurm-*.out"), None)
        return (log.read_text(errors="replace")[-6000:] if log else "(no job output)") + "\n" + slurm_cluster.logs()

    def step_of_rank0() -> int:
        progress = out / "progress-rank0"
        return int(progress.read_text() or 0) if progress.exists() else -1

    try:
        slurm_cluster._wait(lambda: step_of_rank0() >= 2, 150, "training did not start")
        slurm_cluster.run("scancel", "--signal=USR1", job_id, check=True)
        # A requeued job waits ~120 s for its BeginTime; start it now once it is back in the queue.
        slurm_cluster._wait(lambda: slurm_cluster.job_field(job_id, "Restarts") == "1"
                            and slurm_cluster.job_field(job_id, "JobState") == "PENDING", 90, "job was not requeued")
        slurm_cluster.run("scontrol", "update", f"JobId={job_id}", "StartTime=now", check=True)
        state = slurm_cluster.wait_for_job(job_id)
    except (TimeoutError, RuntimeError) as e:
        slurm_cluster.run("scancel", job_id)
        raise AssertionError(f"{e}\n{job_output()}") from None
    assert state == "COMPLETED", f"job {job_id} ended {state}\n{job_output()}"
    assert slurm_cluster.job_field(job_id, "ExitCode") == "0:0", job_output()

    assert (root / "hpc_ckpt_1.ckpt").is_file(), sorted(p.name for p in root.iterdir())
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert {r["restart_count"] for r in ranks} == {1}
    assert {r["world_size"] for r in ranks} == {2}
    assert {r["global_step"] for r in ranks} == {12}
    start = {r["start_step"] for r in ranks}
    assert len(start) == 1 and start.pop() >= 2, f"the restarted job did not resume from hpc_ckpt: {ranks}"
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
