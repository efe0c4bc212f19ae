"""Entry point: the whole recipe as one Snakemake workflow, raw text to a GLUE/SQuAD table, locally or on SLURM.

    python pipeline/workflow.py +workflow=tiny                            # the bundled sample on the CPU, minutes
    python pipeline/workflow.py +workflow=tiny workflow.action=plan       # what a run would run, and why
    python pipeline/workflow.py +workflow=tiny workflow.action=status     # done / running / queued / failed
    python pipeline/workflow.py +workflow=tiny workflow.action=report     # Snakemake's HTML report: times, scores
    python pipeline/workflow.py +workflow=tiny workflow.launcher=slurm    # a controller job submits the stages
    python pipeline/workflow.py +workflow=bert_base workflow.corpus_root=/data/corpus workflow.launcher=slurm ...

Workflows are conf/workflow/<name>.yaml: stages (data prep of phase 1 and 2, pre-training of phase 1 and 2,
export), the downstream tasks and the report, each stage its entry point's own config with overrides. Before
anything runs, every stage's config is composed and passes its entry point's pre-flight checks at the resources
the stage declares. A stage runs again exactly when its result-shaping config or the content of what it reads
changed; a code edit re-runs nothing unless asked (workflow.rerun_code_changed=[stage]); a run directory is never
deleted. See pipeline/orchestration/.
"""
from __future__ import annotations

import shutil
import sys

from pipeline.orchestration.workflow_config import WorkflowError, available_workflows, load_workflow


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print(f"\nworkflows: {', '.join(available_workflows())}")
        return 0 if argv else 2
    try:
        workflow = load_workflow(argv)
        from pipeline.orchestration import launch, plan, status
        if workflow.launcher == "slurm" and workflow.action in ("run", "status"):
            check_slurm_tools()           # the first thing a user on the wrong machine needs to hear
        if workflow.action == "run":
            from pipeline.orchestration.lock import LaunchLock, refuse_if_alive
            # said at once, before minutes of composing and checking (taking nothing)
            refuse_if_alive(workflow, LaunchLock(workflow).holder())
        from pipeline.orchestration.stage_config import stage_specs
        specs = stage_specs(workflow, check_shapes=workflow.action in ("run", "plan"))
        if workflow.action == "plan":
            print(plan.plan(workflow, specs))
        elif workflow.action == "status":
            print(status.format_status(workflow, specs))
        elif workflow.action == "report":
            print(f"Snakemake's report (stage graph, times, scores, pictures): {status.html_report(workflow, specs)}")
        elif workflow.launcher == "slurm":
            return launch.submit_controller(workflow, specs)
        else:
            return launch.run_local(workflow, specs)
        return 0
    except WorkflowError as error:
        print(f"workflow error: {error}", file=sys.stderr)
        return 2


def check_slurm_tools() -> None:
    missing = [tool for tool in ("sbatch", "squeue", "sacct") if shutil.which(tool) is None]
    if missing:
        raise WorkflowError(f"workflow.launcher=slurm, but {', '.join(missing)} not on the PATH: run this on a SLURM "
                            "login node (or install the SLURM client), or use workflow.launcher=local")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
