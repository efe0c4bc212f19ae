"""One bucket of tokenized documents -> the instances of one shard, masked, as Arrow record batches.

A shard is exactly one bucket: its documents are the pool random next sentences are drawn from (or, for the MLM-only
objective, the text packed into full sequences: data_prep/packing.py), so a shard is produced by one worker from data
it holds, and memory is bounded by the bucket size, not the corpus.
"""
from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from data_prep.instances import (
    InstanceConfig,
    InstanceCounts,
    TokenizedDocument,
    create_instances_from_document,
)
from data_prep.masking import MaskedBatch, MaskingConfig, MaskingVocab, mask_batch
from data_prep.packing import assemble_packed, pack_documents
from data_prep.seeding import mix_seeds, stable_seed
from data_prep.stats import InstanceStats

MASKING_MODES = ("static", "dynamic")
OBJECTIVES = ("mlm_nsp", "mlm")   # BERT's sentence pairs with next-sentence labels; contiguous text, MLM only
_ROWS_PER_BATCH = 8192  # bounds the padded (rows, max_seq_length) arrays masking works on


@dataclasses.dataclass(frozen=True)
class ShardSettings:
    instance: InstanceConfig
    masking: MaskingConfig
    masking_mode: str          # "static": stored masked, dupe_factor copies; "dynamic": stored unmasked
    dupe_factor: int
    seed: int
    cls_id: int
    sep_id: int
    masking_vocab: MaskingVocab
    vocab_size: int
    objective: str = "mlm_nsp"

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.masking_mode not in MASKING_MODES:
            raise ValueError(f"masking_mode must be one of {MASKING_MODES}, got {self.masking_mode!r}")
        if self.dupe_factor < 1:
            raise ValueError(f"dupe_factor must be >= 1, got {self.dupe_factor}")

    @property
    def token_dtype(self) -> np.dtype:
        # Compact storage: BERT's 30,522-token vocabularies fit int16.
        return np.dtype(np.int16) if self.vocab_size <= np.iinfo(np.int16).max + 1 else np.dtype(np.int32)

    @property
    def token_type(self) -> pa.DataType:
        return pa.from_numpy_dtype(self.token_dtype)

    @property
    def position_dtype(self) -> np.dtype:
        return np.dtype(np.int16) if self.instance.max_seq_length <= np.iinfo(np.int16).max else np.dtype(np.int32)

    def schema(self) -> pa.Schema:
        fields = [pa.field("input_ids", pa.list_(self.token_type))]   # [CLS] A [SEP] B [SEP] (mlm: [CLS] text [SEP])
        if self.objective == "mlm_nsp":
            fields += [
                pa.field("num_tokens_a", pa.int16()),             # segment 0 = the first num_tokens_a + 2
                pa.field("next_sentence_label", pa.int8()),       # 1: B is random (the reference's label)
            ]
        else:   # where each packed document starts in the row (data_prep/packing.py)
            fields.append(pa.field("document_starts", pa.list_(pa.from_numpy_dtype(self.position_dtype))))
        if self.masking_mode == "static":
            fields += [
                pa.field("masked_lm_positions", pa.list_(pa.int16())),
                pa.field("masked_lm_ids", pa.list_(self.token_type)),   # the original ids there
            ]
        return pa.schema(fields)


@dataclasses.dataclass
class InstanceBatch:
    """Rows of one shard, padded to max_seq_length; masked is None for dynamic masking."""

    input_ids: np.ndarray        # (rows, max_seq_length), masked when static
    num_tokens: np.ndarray
    num_tokens_a: np.ndarray
    next_sentence_labels: np.ndarray
    masked: MaskedBatch | None
    document_starts: np.ndarray | None = None   # MLM-only rows: every row's document start positions, back to back
    num_documents: np.ndarray | None = None     # (rows,): how many of them each row has


def build_shard(
    documents: Sequence[TokenizedDocument], shard_index: int, settings: ShardSettings, stats: InstanceStats
) -> Iterator[InstanceBatch]:
    """All instances of a bucket, `dupe_factor` copies, shuffled, in batches; fills `stats` as it goes."""
    documents = sorted(documents, key=lambda doc: doc.key)   # arrival order must not matter
    if settings.objective == "mlm":
        yield from _build_packed_shard(documents, shard_index, settings, stats)
        return
    spans, seeds, ordinals = [], [], []
    counts = InstanceCounts()
    for copy in range(settings.dupe_factor):
        for doc_index, document in enumerate(documents):
            doc_seed = stable_seed(settings.seed, document.key, copy)
            made = create_instances_from_document(
                documents, doc_index, random.Random(doc_seed), settings.instance, counts)
            spans.extend(made)
            seeds.extend([doc_seed] * len(made))
            ordinals.extend(range(len(made)))
    stats.chunks_without_random_document += counts.chunks_without_random_document
    stats.random_next_from_same_document += counts.random_next_from_same_document
    stats.one_sentence_chunk_instances += counts.one_sentence_chunk_instances
    if not spans:
        return

    # (N, 8) in Instance field order; fromiter over the flattened tuples is ~5x faster than np.array(spans).
    table = np.fromiter(itertools.chain.from_iterable(spans), dtype=np.int64, count=8 * len(spans)).reshape(-1, 8)
    instance_seeds = mix_seeds(np.array(seeds, dtype=np.uint64), np.array(ordinals, dtype=np.uint64))
    order = np.random.default_rng(stable_seed(settings.seed, "shuffle", shard_index)).permutation(len(table))
    table, instance_seeds = table[order], instance_seeds[order]

    pool, doc_offsets = _token_pool(documents, settings)
    for begin in range(0, len(table), _ROWS_PER_BATCH):
        batch = _assemble(table[begin:begin + _ROWS_PER_BATCH], pool, doc_offsets, settings)
        if settings.masking_mode == "static":
            batch.masked = mask_batch(batch.input_ids, batch.num_tokens, batch.num_tokens_a,
                                      instance_seeds[begin:begin + _ROWS_PER_BATCH], settings.masking,
                                      settings.masking_vocab)
            stats.masked_tokens += int(batch.masked.num_masked.sum())
        rows = table[begin:begin + _ROWS_PER_BATCH]
        stats.instances += len(rows)
        stats.tokens += int(batch.num_tokens.sum())
        stats.random_next_instances += int(rows[:, 6].sum())
        stats.short_target_instances += int(rows[:, 7].sum())
        yield batch


def _build_packed_shard(documents: Sequence[TokenizedDocument], shard_index: int, settings: ShardSettings,
                        stats: InstanceStats) -> Iterator[InstanceBatch]:
    packed = pack_documents(documents, shard_index, settings.instance.max_seq_length, settings.dupe_factor,
                            settings.seed, settings.sep_id)
    for begin in range(0, len(packed.starts), _ROWS_PER_BATCH):
        rows = slice(begin, begin + _ROWS_PER_BATCH)
        input_ids, num_tokens, document_starts, num_documents = assemble_packed(
            packed, rows, settings.cls_id, settings.sep_id, settings.instance.max_seq_length)
        # One segment: num_tokens_a + 2 = num_tokens puts every token in segment 0 (what masking and the loader read)
        batch = InstanceBatch(input_ids, num_tokens, num_tokens - 2, np.zeros(len(num_tokens), dtype=np.int8), None,
                              document_starts, num_documents)
        if settings.masking_mode == "static":
            batch.masked = mask_batch(input_ids, num_tokens, batch.num_tokens_a, packed.seeds[rows],
                                      settings.masking, settings.masking_vocab)
            stats.masked_tokens += int(batch.masked.num_masked.sum())
        stats.instances += len(num_tokens)
        stats.tokens += int(num_tokens.sum())
        yield batch


def _token_pool(documents: Sequence[TokenizedDocument], settings: ShardSettings):
    """All documents' ids in one array, then [CLS] and [SEP], so every row is a gather from one place."""
    parts = [doc.token_ids for doc in documents] + [np.array([settings.cls_id, settings.sep_id])]
    pool = np.concatenate(parts).astype(np.int32)
    offsets = np.zeros(len(documents), dtype=np.int64)
    offsets[1:] = np.cumsum([len(doc.token_ids) for doc in documents])[:-1]
    return pool, offsets


def _assemble(rows: np.ndarray, pool: np.ndarray, doc_offsets: np.ndarray, settings: ShardSettings) -> InstanceBatch:
    a_doc, a_start, a_end, b_doc, b_start, b_end, is_random = (rows[:, k] for k in range(7))
    cls_at, sep_at = len(pool) - 2, len(pool) - 1
    len_a, len_b = a_end - a_start, b_end - b_start
    num_tokens = len_a + len_b + 3
    # Each row is five pieces: [CLS], A, [SEP], B, [SEP]; gather them with one concatenated-ranges index.
    piece_starts = np.stack([np.full_like(a_doc, cls_at), doc_offsets[a_doc] + a_start, np.full_like(a_doc, sep_at),
                             doc_offsets[b_doc] + b_start, np.full_like(a_doc, sep_at)], axis=1).ravel()
    piece_lengths = np.stack([np.ones_like(len_a), len_a, np.ones_like(len_a), len_b, np.ones_like(len_a)],
                             axis=1).ravel()
    piece_offsets = np.cumsum(piece_lengths) - piece_lengths
    total = int(piece_lengths.sum())
    flat = pool[np.repeat(piece_starts - piece_offsets, piece_lengths) + np.arange(total)]

    row_of = np.repeat(np.arange(len(rows)), num_tokens)
    column = np.arange(total) - np.repeat(np.cumsum(num_tokens) - num_tokens, num_tokens)
    padded = np.zeros((len(rows), settings.instance.max_seq_length), dtype=np.int32)
    padded[row_of, column] = flat
    return InstanceBatch(padded, num_tokens, len_a, is_random.astype(np.int8), masked=None)


def to_record_batch(batch: InstanceBatch, settings: ShardSettings) -> pa.RecordBatch:
    token_type = settings.token_dtype
    ids = batch.masked.input_ids if batch.masked is not None else batch.input_ids
    keep = np.arange(ids.shape[1])[None, :] < batch.num_tokens[:, None]
    columns = [_list_array(ids[keep].astype(token_type), batch.num_tokens)]
    if settings.objective == "mlm_nsp":
        columns += [pa.array(batch.num_tokens_a.astype(np.int16)), pa.array(batch.next_sentence_labels.astype(np.int8))]
    else:
        columns.append(_list_array(batch.document_starts.astype(settings.position_dtype), batch.num_documents))
    if batch.masked is not None:
        slots = np.arange(batch.masked.positions.shape[1])[None, :] < batch.masked.num_masked[:, None]
        columns += [
            _list_array(batch.masked.positions[slots].astype(np.int16), batch.masked.num_masked),
            _list_array(batch.masked.labels[slots].astype(token_type), batch.masked.num_masked),
        ]
    return pa.RecordBatch.from_arrays(columns, schema=settings.schema())


def _list_array(values: np.ndarray, lengths: np.ndarray) -> pa.ListArray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
