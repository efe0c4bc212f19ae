"""Who may run, and what happens when SLURM signals: one trainer per run directory (the lock and its holder), the
requeue on SIGUSR1 and the SIGTERM agreement between ranks, restarts of a failed try, the gloo address every rank can
reach, and rollbacks moved aside before a job is submitted. Uses run/ (the loggers it finishes, the run's directory)
and checkpoints/ (the newest complete one to restart from)."""
