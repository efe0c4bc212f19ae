"""Training data: data_prep's shard sets -> collated, masked batches for BertForPreTraining, one stream per rank.

    ShardSet.open(path, max_seq_length=..., vocab_size=...)   the set, checked against the model (shard_set.py)
    PretrainingDataset(shard_set, batch_size, rank=, ...)      batches, disjoint per rank and worker (dataset.py)
    PretrainingCollator                                       padding, segments, (dynamic) masking (collator.py)
    PretrainingDataLoader(dataset, epoch_and_skip)             its DataLoader: epochs, worker transfer (loader.py)
    PretrainingDataModule(path, max_seq_length, ...)           the LightningDataModule, exact resume (datamodule.py)
    BatchWarmup, StepStreamDataset                             batch-size warm-up: each step's rows a function of the
                                                              step (batch_warmup.py, step_stream.py)

datamodule is not imported here: it needs Lightning, which loader worker processes do not.
"""
from pipeline.pretraining.data.collator import PretrainingCollator
from pipeline.pretraining.data.dataset import PretrainingDataset
from pipeline.pretraining.data.loader import PretrainingDataLoader
from pipeline.pretraining.data.shard_set import ShardSet

__all__ = ["PretrainingCollator", "PretrainingDataLoader", "PretrainingDataset", "ShardSet"]
