"""Helpers of the tests (and of the benchmarks that build the same small data): shard sets made by the real data
prep job, a real local SLURM, tiny training runs, W&B offline logs, the workflow run as users run it."""
