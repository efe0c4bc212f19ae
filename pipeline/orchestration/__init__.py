"""The workflow (pipeline/workflow.py): the recipe as Snakemake rules, locally or on SLURM; see README.md here."""
