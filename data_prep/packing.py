"""Instances of the MLM-only objective (RoBERTa's FULL-SENTENCES, MosaicBERT, Cramming, Izsak et al.): contiguous
text packed into full sequences, no second segment, no next-sentence label.

A shard's documents, in an order drawn from the seed and the shard (never from arrival order), are joined into one
stream with a [SEP] between documents; each instance is `[CLS]` + the next `max_seq_length - 2` tokens of the
stream + `[SEP]`, cut across sentence and document boundaries. The stream is read as a ring: the last instance takes
its missing tokens from the stream's start, so every instance is full (only a shard whose whole text is shorter than
one sequence gives a shorter one). Copy c of `dupe_factor` starts at an offset drawn from (seed, shard, c) (copy 0 at
the stream's start), so the copies cut the text at other places, and static masking masks each copy anew.

Each row also records where its documents start (a model that attends within documents never attends across one):
position 0, [CLS], starts the row's first document, whatever part of it the row holds; a later position starts
one where its token is a document's first in the stream: right after a separating [SEP] (which belongs to the
document it ends) or, where the window wraps around the ring, the stream's first token. Position 1 never starts
one of its own: [CLS] joins the document there rather than being a document by itself.
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
    document_start: np.ndarray  # (S,) bool: True at each document's first token in the stream
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


def document_start_flags(documents: Sequence[TokenizedDocument], order: np.ndarray) -> np.ndarray:
    """(S,) bool over document_stream's tokens: True at each document's first token."""
    lengths = np.array([len(documents[index].token_ids) for index in order], dtype=np.int64)
    flags = np.zeros(int(lengths.sum()) + max(len(lengths) - 1, 0), dtype=bool)
    if len(lengths):
        flags[np.cumsum(lengths + 1) - (lengths + 1)] = True   # each document follows the previous one and a [SEP]
    return flags


def pack_documents(documents: Sequence[TokenizedDocument], shard_index: int, max_seq_length: int,
                   dupe_factor: int, seed: int, sep_id: int) -> PackedInstances:
    """`documents` sorted by key; the instances of every copy, shuffled together."""
    order = np.random.default_rng(stable_seed(seed, "pack-order", shard_index)).permutation(len(documents))
    stream = document_stream(documents, order, sep_id)
    starts_flags = document_start_flags(documents, order)
    body = min(max_seq_length - 2, len(stream))
    if body == 0:
        return PackedInstances(stream, starts_flags, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64), 0)
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
    return PackedInstances(stream, starts_flags, starts_all[shuffle], seeds[shuffle], body)


def assemble_packed(instances: PackedInstances, rows: slice, cls_id: int, sep_id: int,
                    max_seq_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids padded to max_seq_length, num_tokens, document start positions back to back, documents per row)
    of instances[rows]: [CLS] body [SEP]."""
    starts = instances.starts[rows]
    body = instances.body_length
    index = (starts[:, None] + np.arange(body)[None, :]) % len(instances.stream)     # (n, body): the ring
    padded = np.zeros((len(starts), max_seq_length), dtype=np.int32)
    padded[:, 0] = cls_id
    padded[:, 1:body + 1] = instances.stream[index]
    padded[:, body + 1] = sep_id
    document_starts, documents = row_document_starts(instances.document_start[index])
    return padded, np.full(len(starts), body + 2, dtype=np.int64), document_starts, documents


def row_document_starts(body_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions, count per row) of each row's document starts, from (n, body) flags over its body tokens: 0 for
    [CLS], then 1 + j for every flagged body token j > 0 (the module docstring says why not j = 0)."""
    flags = np.zeros((len(body_starts), body_starts.shape[1] + 1), dtype=bool)   # (n, 1 + body): row positions
    flags[:, 0] = True
    flags[:, 2:] = body_starts[:, 1:]
    rows, positions = np.nonzero(flags)   # row-major: ascending positions within each row
    return positions.astype(np.int64), np.bincount(rows, minlength=len(flags)).astype(np.int64)
