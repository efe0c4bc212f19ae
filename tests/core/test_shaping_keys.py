"""The operational keys (pipeline/core/run/shaping.py) against what the data stream does (issue 36, item 8): the rows of
each of the first optimizer steps, read by the real datasets, samplers and loaders (with worker processes) under two
settings of a key, differ exactly when the list counts the key as shaping."""
from __future__ import annotations

import itertools

import datasets
import numpy as np
import pytest
from lightning_fabric.utilities.distributed import DistributedSamplerWrapper

from pipeline.core.run.shaping import OPERATIONAL, names

STEPS, GLOBAL_BATCH = 3, 8


def pretraining_step_rows(shard_set, world=1, workers=1, micro=4, pad=8) -> list[list[int]]:
    """The shard rows of each of the first STEPS optimizer steps of GLOBAL_BATCH sequences: every rank's micro-batches
    of the step, as train() loads them."""
    from pipeline.pretraining.data.dataset import PretrainingDataset
    from pipeline.pretraining.data.loader import PretrainingDataLoader

    accumulation = GLOBAL_BATCH // (world * micro)
    ranks = []
    for rank in range(world):
        data = PretrainingDataset(shard_set, micro, rank=rank, world_size=world, num_workers=workers, seed=1234,
                                  pad_to_multiple_of=pad, return_row_index=True)
        ranks.append([b["row_index"].tolist() for b in itertools.islice(PretrainingDataLoader(data),
                                                                          STEPS * accumulation)])
    return [sorted(row for batches in ranks for batch in batches[s * accumulation:(s + 1) * accumulation]
                   for row in batch) for s in range(STEPS)]


# key -> (a setting, the same with the key changed). The pass size moves the rows of a step where the loader's
# round robin over its workers meets another accumulation (8 x 1: a step is one worker's batch; 4 x 2: both workers').
PRETRAINING = {"data.num_workers": ({}, {"workers": 2}),
               "data.micro_batch_size": ({"workers": 2}, {"workers": 2, "micro": 8}),
               "trainer.devices": ({}, {"world": 2}), "trainer.num_nodes": ({}, {"world": 2}),
               "data.pad_to_multiple_of": ({"workers": 2}, {"workers": 2, "pad": 128})}


@pytest.mark.parametrize("key", PRETRAINING)
def test_a_pretraining_key_is_operational_exactly_when_the_steps_take_the_same_rows(key, small_shards):
    from pipeline.pretraining.data.shard_set import ShardSet

    shard_set = ShardSet.open(small_shards, max_seq_length=128, vocab_size=30522)
    setting, changed = PRETRAINING[key]
    base = pretraining_step_rows(shard_set, **setting)
    assert all(len(rows) == GLOBAL_BATCH for rows in base)
    same = pretraining_step_rows(shard_set, **changed) == base
    operational = names(key, OPERATIONAL["train"])
    assert same == operational, (f"{key}: the steps take {'the same' if same else 'other'} rows, yet "
                                 f"pipeline/core/run/shaping.py counts it as "
                                 f"{'operational' if operational else 'shaping'}")


def finetuning_step_rows(world=1, workers=0, group_by_length=True, batch=GLOBAL_BATCH) -> list[list[int]]:
    """The rows of each of the first STEPS fine-tuning steps of a global batch: finetune()'s loader per rank, with the
    sampler Lightning puts around it on several devices (DistributedSamplerWrapper, no shuffle of its own)."""
    import torch

    from pipeline.finetuning.batches import FeatureRows, PaddingCollator, train_loader

    lengths = np.random.default_rng(0).integers(3, 60, size=400)
    rows = FeatureRows(datasets.Dataset.from_dict({
        "input_ids": [[5] * n for n in lengths], "token_type_ids": [[0] * n for n in lengths],
        "length": lengths.tolist(), "label": [int(n % 2) for n in lengths]}), "classification")
    micro = batch // world
    ranks = []
    for rank in range(world):
        loader = train_loader(rows, micro, PaddingCollator(0), group_by_length, seed=1, num_workers=workers)
        if world > 1:
            loader = torch.utils.data.DataLoader(
                rows, batch_size=micro, collate_fn=loader.collate_fn, num_workers=workers,
                sampler=DistributedSamplerWrapper(loader.sampler, num_replicas=world, rank=rank, shuffle=False))
        ranks.append([b["row"].tolist() for b in itertools.islice(loader, STEPS)])
    return [sorted(row for batches in ranks for row in batches[s]) for s in range(STEPS)]


@pytest.mark.parametrize("key, setting", [("data.num_workers", {"workers": 2}), ("trainer.devices", {"world": 2})])
def test_a_finetuning_key_is_operational_exactly_when_the_steps_take_the_same_rows(key, setting):
    """Length-grouped batches are grouped per device batch: on two devices the steps take other rows."""
    base = finetuning_step_rows()
    assert finetuning_step_rows() == base
    assert (finetuning_step_rows(**setting) == base) == names(key, OPERATIONAL["finetune"])
