"""Training: the data loader (pipeline/pretraining/data/), Lightning and DeepSpeed around model/."""
