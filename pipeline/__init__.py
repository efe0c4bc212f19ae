"""Training: the data loader (pipeline/data/), Lightning and DeepSpeed around model/."""
