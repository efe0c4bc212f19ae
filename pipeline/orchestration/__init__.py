"""The workflow: the recipe (data prep -> phase 1 -> phase 2 -> export -> downstream suite -> report) as Snakemake
rules, run locally or as SLURM jobs. Entry point: pipeline/workflow.py.

spec.py (the stages, from conf/workflow/) -> stages.py (each stage's entry-point config, composed) -> preflight.py
(checked at its declared shape) and identity.py (what its result depends on) -> launch.py (plan, run locally, or
submit controller.py as a SLURM job; guard.py: one launch at a time) -> Snakefile (a rule per stage, run with
snakemake_cli.py's options; slurm_resources.py: sbatch options) -> stage.py (one stage: its run directory, its
entry point, its sentinel; runs.py). Views: status.py (slurm_jobs.py asks SLURM), report.py.
"""
