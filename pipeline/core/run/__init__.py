"""What a run is and whether a start may continue it: the record of its config and code, the keys that shape its
result and the changes a resume accepts, a fresh start that would overwrite a run, a rollback to an earlier step, its
output directory, loggers, curves and progress bar. Uses checkpoints/ only."""
