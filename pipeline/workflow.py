"""Entry point: the whole recipe as one workflow, raw text to a GLUE/SQuAD table, locally or on SLURM.

    python pipeline/workflow.py +workflow=tiny                            # the bundled sample on the CPU, minutes
    python pipeline/workflow.py +workflow=tiny workflow.launcher=slurm    # each stage an sbatch job, dependencies
    python pipeline/workflow.py +workflow=tiny workflow.action=status     # done / running / pending / failed
    python pipeline/workflow.py +workflow=tiny workflow.action=plan       # what a run would do, and why
    python pipeline/workflow.py +workflow=bert_base workflow.corpus_root=/data/corpus workflow.launcher=slurm ...

Workflows are conf/workflow/<name>.yaml: stages (data prep phase 1 and 2, pre-training phase 1 and 2, export),
the downstream tasks and the report, each stage composed from its entry point's own config by overrides.
Re-running is safe: a stage done with the same config and inputs is skipped; an interrupted pre-training resumes
from its last checkpoint. Everything that can be wrong with a workflow is reported before anything runs.
"""
from __future__ import annotations

import sys

from pipeline.orchestration.spec import WorkflowError, available_workflows, load_workflow


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print(f"\nworkflows: {', '.join(available_workflows())}")
        return 0 if argv else 2
    try:
        workflow = load_workflow(argv)
        from pipeline.orchestration.plan import build_plan, decide
        if workflow.action == "run" and workflow.launcher == "slurm":
            from pipeline.orchestration.slurm_launcher import check_sbatch
            check_sbatch()     # before the plan's checks: the first thing a user on the wrong machine needs to hear
        plans = build_plan(workflow)
        if workflow.action == "status":
            from pipeline.orchestration.status import format_status, workflow_status
            print(format_status(workflow, workflow_status(workflow, plans)))
            return 0
        if workflow.action == "plan":
            reasons = decide(workflow, plans)
            width = max(len(name) for name in plans)
            print(f"workflow {workflow.name} ({workflow.launcher}), outputs in {workflow.root}")
            for name, plan in plans.items():
                print(f"  {name:<{width}}  {'run: ' + reasons[name] if reasons[name] else 'skip: done'}")
                print(f"  {'':<{width}}    {' '.join(plan.argv[1:])}")
            return 0
        if workflow.launcher == "slurm":
            from pipeline.orchestration.slurm_launcher import submit
            return submit(workflow, plans)
        from pipeline.orchestration.local_launcher import run_locally
        return run_locally(workflow, plans)
    except WorkflowError as error:
        print(f"workflow error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
