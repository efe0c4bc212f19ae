"""Pre-training: the checks before a run (checks), the run (run), the LightningModule (module), shard loading
(data/) and the Hugging Face export of a finished run (export)."""
