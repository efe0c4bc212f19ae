"""Featurized rows -> batches padded to their own longest sequence, optionally drawn in groups of similar length.

Padding every SST-2 sentence (about 13 tokens with [CLS]/[SEP]) to 128, as transformers' run_glue does by default,
spends most of the compute on padding; padding to the batch's longest does not. Length-grouped sampling
(`group_by_length`) goes further for training: shuffle, cut into mega-batches of 50 batches, sort each by length,
so a batch holds sentences of similar length while the order stays random at the scale of an epoch (the scheme of
transformers' LengthGroupedSampler). Evaluation always runs in order of length and puts the predictions back in
row order (each batch carries its rows' positions in `row`).

A batch: input_ids, token_type_ids, attention_mask (B, T) int64 - (B, K, T) for multiple choice -, labels: (B,)
for sequence tasks (float for regression), (B, 2) start and end positions for span tasks (SQuAD), (B, T) per token
for token tasks (NER; -100 where a token has no label, padding included) - and row (B,) positions in the split.

The loaders' workers ignore SLURM's requeue signal, whatever the start method
(pipeline/core/cluster/requeue_safe_loader.py).
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import datasets
import numpy as np
import torch

from model.shared.outputs import IGNORE_INDEX
from pipeline.core.cluster.requeue_safe_loader import RequeueSafeDataLoader

MEGABATCH_BATCHES = 50


class FeatureRows(torch.utils.data.Dataset):
    """The columns of a featurized split, held as Python lists (a few hundred MB for the largest GLUE task)."""

    def __init__(self, features: datasets.Dataset, kind: str):
        """kind: the task's (classification, regression, multiple_choice, span, token)."""
        # [:] materialises the columns: datasets 5 returns lazy Column objects, whose per-row indexing in the
        # training loop would cost more than the model's forward pass on short sentences.
        self.input_ids = features["input_ids"][:]
        self.token_type_ids = features["token_type_ids"][:]
        self.lengths = np.asarray(features["length"][:], dtype=np.int64)
        labels = features["label"][:] if "label" in features.column_names else [-1] * len(self.lengths)
        # Token labels stay one list per row (their lengths differ); everything else is one array.
        self.labels = labels if kind == "token" else np.asarray(
            labels, dtype=np.float32 if kind == "regression" else np.int64)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, row: int) -> dict:
        return {"input_ids": self.input_ids[row], "token_type_ids": self.token_type_ids[row],
                "label": self.labels[row], "row": row}


def _round_up(n: int, multiple: int) -> int:
    return int(math.ceil(n / multiple) * multiple)


class PaddingCollator:
    def __init__(self, pad_id: int, pad_to_multiple_of: int = 1):
        if pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        self.pad_id = pad_id
        self.multiple = pad_to_multiple_of

    def __call__(self, rows: Sequence[dict]) -> dict[str, torch.Tensor]:
        first = rows[0]["input_ids"]
        choices = isinstance(first[0], list)   # multiple choice: a list of K sequences per row
        sequences = [seq for row in rows for seq in (row["input_ids"] if choices else [row["input_ids"]])]
        types = [seq for row in rows for seq in (row["token_type_ids"] if choices else [row["token_type_ids"]])]
        T = _round_up(max(map(len, sequences)), self.multiple)
        input_ids = torch.full((len(sequences), T), self.pad_id, dtype=torch.long)
        token_type_ids = torch.zeros((len(sequences), T), dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), T), dtype=torch.long)
        for i, (ids, segment) in enumerate(zip(sequences, types)):
            input_ids[i, :len(ids)] = torch.tensor(ids)
            token_type_ids[i, :len(ids)] = torch.tensor(segment)
            attention_mask[i, :len(ids)] = 1
        batch = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
        if choices:
            K = len(first)
            batch = {key: value.view(len(rows), K, T) for key, value in batch.items()}   # (B, K, T)
        labels = [row["label"] for row in rows]
        if isinstance(labels[0], list) and not choices:   # per token: pad with the ignored label
            padded = torch.full((len(rows), T), IGNORE_INDEX, dtype=torch.long)
            for i, row_labels in enumerate(labels):
                padded[i, :len(row_labels)] = torch.tensor(row_labels)
            batch["labels"] = padded
        else:
            batch["labels"] = torch.from_numpy(np.asarray(labels))
        batch["row"] = torch.tensor([row["row"] for row in rows], dtype=torch.long)
        return batch


class LengthGroupedSampler(torch.utils.data.Sampler[int]):
    """A random order in which each run of batch_size rows has similar lengths; a new order every epoch."""

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int):
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:   # called by Lightning (and DistributedSamplerWrapper) each epoch
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.lengths))
        size = self.batch_size * MEGABATCH_BATCHES
        for start in range(0, len(order), size):
            megabatch = order[start:start + size]
            # longest first within the mega-batch; stable, so equal lengths keep their random order
            yield from megabatch[np.argsort(-self.lengths[megabatch], kind="stable")].tolist()


class ShuffledSampler(torch.utils.data.Sampler[int]):
    """A plain random order, seeded per epoch (no global RNG: the same order whatever ran before)."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        return iter(np.random.default_rng([self.seed, self.epoch]).permutation(self.size).tolist())


def by_length(lengths: np.ndarray) -> list[int]:
    """Rows shortest first: evaluation batches then pad little."""
    return np.argsort(lengths, kind="stable").tolist()


def train_loader(rows: FeatureRows, batch_size: int, collator: PaddingCollator, group_by_length: bool, seed: int,
                 num_workers: int = 0) -> RequeueSafeDataLoader:
    sampler = (LengthGroupedSampler(rows.lengths, batch_size, seed) if group_by_length
               else ShuffledSampler(len(rows), seed))
    return RequeueSafeDataLoader(rows, batch_size=batch_size, sampler=sampler, collate_fn=collator,
                                 num_workers=num_workers, persistent_workers=num_workers > 0)


def eval_loader(rows: FeatureRows, batch_size: int, collator: PaddingCollator,
                num_workers: int = 0) -> RequeueSafeDataLoader:
    return RequeueSafeDataLoader(rows, batch_size=batch_size, sampler=by_length(rows.lengths), collate_fn=collator,
                                 num_workers=num_workers)
