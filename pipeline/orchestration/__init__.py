"""The workflow: the recipe (data prep -> phase 1 -> phase 2 -> export -> downstream suite -> report) as Snakemake
rules, run locally or as SLURM jobs. Entry point: pipeline/workflow.py.

spec.py (the workflow config, checked against workflow.schema.yaml) -> stages.py (each stage's entry-point config,
composed and checked at its declared shape; identity.py: what shapes its result) -> launch.py (run locally, or submit
controller.py as a SLURM job, from a snapshot of the code; lock.py: one launch at a time) -> Snakefile (a rule per
stage; profiles/default/ and infra/slurm/snakemake/: Snakemake's settings; slurm.py: sbatch options and the queue)
-> stage.py (one stage: its run directory, its entry point, its sentinel; runs.py). views.py: plan, status, report;
report.py: the report rule.
"""
