"""The fine-tuning stage: where the weights and tokenizer come from, task rows to padded batches, the
LightningModule, and the files a run leaves. The tasks themselves (readers, metrics) are in
pipeline/finetuning/tasks/."""
