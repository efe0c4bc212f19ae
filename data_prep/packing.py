"""Instances of the MLM-only objective (RoBERTa's FULL-SENTENCES, MosaicBERT, Cramming, Izsak et al.): contiguous
text packed into full sequences, no second segment, no next-sentence label.

A shard's documents, in an order drawn from the seed and the shard (never from arrival order), are joined into one
stream with a [SEP] between documents; each instance is `[CLS]` + the next `max_seq_length - 2` tokens of the
stream + `[SEP]`, cut across sentence and document boundaries. The stream is read as a ring: the last instance takes
its missing tokens from the stream's start, so every instance is full (only a shard whose whole text is shorter than
one sequence gives a shorter one). Copy c of `dupe_factor` starts at an offset drawn from (seed, shard, c) (copy 0 at
the stream's start), so the copies cut the text at other places, and static masking masks each copy anew.
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import numpy as np

from data_prep.instances import TokenizedDocument
from data_prep.seeding import mix_seeds, stable_seed


@dataclasses.dataclass
class PackedInstances:
    """Instance k of the shard is stream[starts[k]:starts[k] + body_length] (modulo the stream's length),
    between [CLS] and [SEP]; seeds[k] is its masking seed."""

    stream: np.ndarray     # (S,) int32: the shard's documents, [SEP] between them
    starts: np.ndarray     # (N,) int64, shuffled over the copies
    seeds: np.ndarray      # (N,) uint64
    body_length: int       # max_seq_length - 2, or the stream's length where it is shorter


def document_stream(documents: Sequence[TokenizedDocument], order: np.ndarray, sep_id: int) -> np.ndarray:
    parts = []
    for position, index in enumerate(order):
        if position:
            parts.append(np.array([sep_id], dtype=np.int32))
        parts.append(documents[index].token_ids.astype(np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def pack_documents(documents: Sequence[TokenizedDocument], shard_index: int, max_seq_length: int,
                   dupe_factor: int, seed: int, sep_id: int) -> PackedInstances:
    """`documents` sorted by key; the instances of every copy, shuffled together."""
    order = np.random.default_rng(stable_seed(seed, "pack-order", shard_index)).permutation(len(documents))
    stream = document_stream(documents, order, sep_id)
    body = min(max_seq_length - 2, len(stream))
    if body == 0:
        return PackedInstances(stream, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64), 0)
    starts, copy_seeds = [], []
    for copy in range(dupe_factor):
        offset = 0 if copy == 0 else random.Random(stable_seed(seed, "pack-offset", shard_index, copy)).randrange(body)
        count = -(-len(stream) // body)   # windows enough to cover the stream once
        starts.append(offset + body * np.arange(count, dtype=np.int64))
        copy_seeds.append(np.full(count, stable_seed(seed, "pack-mask", shard_index, copy), dtype=np.uint64))
    starts_all = np.concatenate(starts) % len(stream)
    ordinals = np.concatenate([np.arange(len(s), dtype=np.uint64) for s in starts])
    seeds = mix_seeds(np.concatenate(copy_seeds), ordinals)   # per instance: (copy's seed, ordinal in the copy)
    shuffle = np.random.default_rng(stable_seed(seed, "shuffle", shard_index)).permutation(len(starts_all))
    return PackedInstances(stream, starts_all[shuffle], seeds[shuffle], body)


def assemble_packed(instances: PackedInstances, rows: slice, cls_id: int, sep_id: int,
                    max_seq_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids padded to max_seq_length, num_tokens) of instances[rows]: [CLS] body [SEP]."""
    starts = instances.starts[rows]
    body = instances.body_length
    index = (starts[:, None] + np.arange(body)[None, :]) % len(instances.stream)     # (n, body): the ring
    padded = np.zeros((len(starts), max_seq_length), dtype=np.int32)
    padded[:, 0] = cls_id
    padded[:, 1:body + 1] = instances.stream[index]
    padded[:, body + 1] = sep_id
    return padded, np.full(len(starts), body + 2, dtype=np.int64)
