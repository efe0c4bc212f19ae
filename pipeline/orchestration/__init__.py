"""The workflow: the recipe (data prep -> phase 1 -> phase 2 -> export -> downstream suite -> report) as Snakemake
rules, run locally or as SLURM jobs. Entry point: pipeline/workflow.py.

spec.py (the workflow config, checked against workflow.schema.yaml) -> stages.py (each stage's entry-point config,
composed; preflight.py: checked at its declared shape; identity.py: what shapes its result) -> launch.py (plan, run
locally, or submit controller.py as a SLURM job; lock.py: one launch at a time; snapshot.py: the code it runs) ->
Snakefile (a rule per stage; profiles/default/ and infra/slurm/snakemake/: Snakemake's settings;
slurm_resources.py: sbatch options) -> stage.py (one stage: its run directory, its entry point, its sentinel;
runs.py). Views: status.py (slurm_jobs.py asks SLURM), report.py.
"""
