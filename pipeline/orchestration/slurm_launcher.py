"""The SLURM launcher: every stage that must run becomes an sbatch job, after the jobs of the stages it reads
(`--dependency=afterok:<ids>`, with `--kill-on-invalid-dep=yes`, so that a failed stage's dependents are cancelled
instead of waiting forever). SLURM schedules; this module only writes job scripts and submits them.

- Fine-tuning stages of the downstream suite with the same inputs and resources go as one job array, a task each.
- Pre-training jobs are requeued as infra/slurm/train.sbatch's are: SIGUSR1 before the time limit, Lightning saves
  hpc_ckpt_*.ckpt and requeues, the restarted job resumes (stage_job passes ckpt_path=last); their run directory is
  the stage's, which does not change with the job id.
- The report job runs after every other job has ended (afterany), failed ones included, to say what failed.
- A stage whose job is still queued or running (same hash) is not submitted again; its dependents wait for it.
"""
from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from pipeline.orchestration import markers
from pipeline.orchestration.plan import StagePlan, decide, report_upstream, write_plan
from pipeline.core.app import REPO_ROOT
from pipeline.orchestration.spec import Workflow, WorkflowError
from pipeline.orchestration.status import queued_jobs

JOB_DIR = "jobs"
LOG_DIR = "logs"


def check_sbatch() -> None:
    missing = [tool for tool in ("sbatch", "squeue") if shutil.which(tool) is None]
    if missing:
        raise WorkflowError(f"workflow.launcher=slurm, but {' and '.join(missing)} is not on the PATH: run this on a "
                            "SLURM login node (or install the SLURM client), or use workflow.launcher=local")


def _job_name(workflow: Workflow, stage: str) -> str:
    return f"{workflow.name}-{stage}"


def sbatch_directives(workflow: Workflow, name: str, plan: StagePlan, log_pattern: str) -> list[str]:
    r = plan.resources
    lines = [f"--job-name={_job_name(workflow, name)}", f"--output={log_pattern}", f"--chdir={REPO_ROOT}",
             f"--nodes={r['nodes']}", f"--ntasks-per-node={max(1, r['gpus_per_node'])}",
             f"--cpus-per-task={r['cpus_per_task']}", f"--time={r['time']}"]
    if r["gpus_per_node"]:
        lines.append(f"--gpus-per-node={r['gpus_per_node']}")
    if r["mem"] is not None:
        lines.append(f"--mem={r['mem']}")
    if workflow.slurm.get("partition"):
        lines.append(f"--partition={workflow.slurm['partition']}")
    if workflow.slurm.get("account"):
        lines.append(f"--account={workflow.slurm['account']}")
    if plan.entry == "train":
        # As infra/slurm/train.sbatch: USR1 before the time limit -> Lightning checkpoints and requeues; the
        # requeued job appends to the same log.
        lead = int(workflow.slurm.get("requeue_signal_lead_s", 120))
        lines += [f"--signal=USR1@{lead}", "--requeue", "--open-mode=append"]
    lines += [str(a).lstrip("-") for a in workflow.slurm.get("extra_args") or ()]
    return [f"#SBATCH --{line.lstrip('-')}" for line in lines]


def job_script(workflow: Workflow, plan_path: Path, stages: list[StagePlan], log_dir: Path) -> tuple[str, str]:
    """(script, log pattern); one stage, or a job array of several (task i runs stages[i])."""
    first = stages[0]
    python = shlex.quote(first.argv[0])
    run = f"{python} -m pipeline.orchestration.stage_job --plan={shlex.quote(str(plan_path))}"
    if len(stages) == 1:
        name = first.name
        log_pattern = str(log_dir / f"{name}-%j.out")
        body = [f'exec {run} --stage={shlex.quote(name)} --log="{log_dir}/{name}-${{SLURM_JOB_ID}}.out"']
        directives = sbatch_directives(workflow, name, first, log_pattern)
    else:
        name = first.group or "array"
        log_pattern = str(log_dir / f"{name}-%A_%a.out")
        directives = sbatch_directives(workflow, name, first, log_pattern) + [f"#SBATCH --array=0-{len(stages) - 1}"]
        body = [f"STAGES=({' '.join(shlex.quote(s.name) for s in stages)})",
                'STAGE="${STAGES[$SLURM_ARRAY_TASK_ID]}"',
                f'exec {run} --stage="$STAGE" --log="{log_dir}/{name}-${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}.out"']
    script = "\n".join([
        "#!/bin/bash",
        f"# Workflow {workflow.name}: {', '.join(s.name for s in stages)}. Written and submitted by",
        "# pipeline/workflow.py (workflow.launcher=slurm); the stage's command is in the plan it names.",
        *directives,
        "set -euo pipefail",
        f"export PYTHONPATH={shlex.quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}",
        'echo "$(date -Is) job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST}"',
        *body,
        "",
    ])
    return script, log_pattern


def _batches(plans: dict[str, StagePlan], to_run: list[str]) -> list[list[StagePlan]]:
    """The stages to submit, in order; downstream stages with the same inputs and resources share one array."""
    batches: list[list[StagePlan]] = []
    for name in to_run:
        plan = plans[name]
        last = batches[-1][-1] if batches else None
        if (plan.group and last is not None and last.group == plan.group and last.upstream == plan.upstream
                and last.resources == plan.resources):
            batches[-1].append(plan)
        else:
            batches.append([plan])
    return batches


def submit(workflow: Workflow, plans: dict[str, StagePlan], echo=print) -> int:
    check_sbatch()
    reasons = decide(workflow, plans)
    stamp = markers.now().replace(":", "").replace("-", "")[:15]
    plan_path = write_plan(workflow, plans, name=f"plan-{stamp}.json")   # this submission's jobs read this one
    write_plan(workflow, plans)                                        # the latest, for status and the report
    job_dir, log_dir = workflow.state_dir / JOB_DIR, workflow.state_dir / LOG_DIR
    job_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    queue = queued_jobs() or {}

    job_of: dict[str, str] = {}          # stage -> the job its dependents wait for (this run's, or one still queued)
    to_run: list[str] = []
    width = max(len(name) for name in plans)
    for name, plan in plans.items():
        marker = markers.read_marker(workflow.state_dir, name)
        if reasons[name] is None:
            echo(f"  {name:<{width}}  skipped: done, same config and inputs")
            continue
        queued = marker and marker.get("job_id") in queue and marker.get("config_hash") == plan.config_hash
        if queued and not plan.is_report and marker.get("state") in (markers.SUBMITTED, markers.RUNNING,
                                                                      markers.INTERRUPTED):
            job_of[name] = marker["job_id"]
            echo(f"  {name:<{width}}  already queued or running as job {marker['job_id']}: not submitted again")
            continue
        to_run.append(name)

    for batch in _batches(plans, to_run):
        first = batch[0]
        upstream = report_upstream(plans) if first.is_report else first.upstream
        waits_for = sorted({job_of[up].split("_")[0] for up in upstream if up in job_of})
        script, _ = job_script(workflow, plan_path, batch, log_dir)
        script_path = job_dir / f"{first.group if len(batch) > 1 else first.name}.sbatch"
        script_path.write_text(script, encoding="utf-8")
        command = ["sbatch", "--parsable"]
        if waits_for:
            kind = "afterany" if first.is_report else "afterok"
            command += [f"--dependency={kind}:{':'.join(waits_for)}", "--kill-on-invalid-dep=yes"]
        command.append(str(script_path))
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise WorkflowError(f"sbatch refused the job of stage {first.name}: {result.stderr.strip()} "
                                f"(script: {script_path}); jobs submitted so far: {job_of or 'none'}")
        job_id = result.stdout.strip().split(";")[0]
        for index, plan in enumerate(batch):
            stage_job = f"{job_id}_{index}" if len(batch) > 1 else job_id
            log = (log_dir / f"{first.group}-{job_id}_{index}.out" if len(batch) > 1
                   else log_dir / f"{plan.name}-{job_id}.out")
            job_of[plan.name] = stage_job
            markers.write_marker(workflow.state_dir, plan.name, markers.SUBMITTED, config_hash=plan.config_hash,
                                 job_id=stage_job, log=str(log), submitted_at=markers.now(),
                                 reason=reasons[plan.name])
            after = f" after {', '.join(waits_for)}" if waits_for else ""
            echo(f"  {plan.name:<{width}}  submitted as job {stage_job}{after} ({reasons[plan.name]})")
    echo(f"status: python pipeline/workflow.py +workflow={workflow.name} workflow.action=status")
    return 0
