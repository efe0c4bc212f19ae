"""Workflows: the recipe (data prep -> phase 1 -> phase 2 -> export -> downstream suite -> report) as stages that run
locally in order or as SLURM jobs with dependencies. Entry point: pipeline/workflow.py.

spec.py (the stages, checked) -> entries.py (each stage's command) -> plan.py (hashes, what must run) ->
local_launcher.py / slurm_launcher.py (how they start) -> stage_job.py (one stage, with its marker: markers.py);
status.py, report.py, export_stage.py, wandb_links.py.
"""
