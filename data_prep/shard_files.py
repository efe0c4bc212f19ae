"""Writing one shard's files: Parquet (and optionally TFRecord), checksummed, atomically named.

Files are written under a temporary name and renamed when complete, so a retried or killed worker never
leaves a half shard under a final name; content is deterministic, so a retry rewrites the same bytes.
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from data_prep.instances import InstanceConfig, TokenizedDocument
from data_prep.layout import shard_name
from data_prep.masking import MaskingConfig, MaskingVocab
from data_prep.plan import JobPlan
from data_prep.shards import ShardSettings, build_shard, to_record_batch
from data_prep.stats import InstanceStats
from data_prep.vocab import SPECIAL_TOKENS

PARQUET_ROW_GROUP_ROWS = 8192   # the unit training readers split a shard by (per rank, per loader worker)


def shard_settings(plan: JobPlan, tokens: list[str]) -> ShardSettings:
    config = plan.config
    return ShardSettings(
        instance=InstanceConfig(config.max_seq_length, config.short_seq_prob, config.random_next_prob),
        masking=MaskingConfig(config.masked_lm_prob, config.max_predictions_per_seq, config.whole_word_masking,
                              packed=config.objective == "mlm"),
        masking_mode=config.masking,
        dupe_factor=config.dupe_factor,
        seed=config.seed,
        cls_id=tokens.index("[CLS]"),
        sep_id=tokens.index("[SEP]"),
        masking_vocab=MaskingVocab.from_tokens(tokens, set(SPECIAL_TOKENS)),
        vocab_size=len(tokens),
        objective=config.objective,
    )


class _HashingWriter:
    """A write-only binary file that hashes and counts what passes through it."""

    def __init__(self, raw):
        self.raw, self.sha256, self.size, self.closed = raw, hashlib.sha256(), 0, False

    def write(self, data) -> int:
        data = bytes(data)
        self.sha256.update(data)
        self.size += len(data)
        return self.raw.write(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        if not self.closed:
            self.raw.close()
            self.closed = True

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False


@dataclasses.dataclass
class WrittenFile:
    path: str
    bytes: int
    sha256: str


def write_shard(documents: Sequence[TokenizedDocument], index: int, plan: JobPlan, settings: ShardSettings) -> dict:
    """Build and write one shard; returns its manifest entry."""
    stats = InstanceStats()
    out_dir = plan.config.output_dir
    parquet_path = FileSystems.join(out_dir, shard_name(index, plan.num_shards, "parquet"))
    sinks = {"parquet": _HashingWriter(FileSystems.create(parquet_path + ".tmp"))}
    tfrecord_path = None
    if "tfrecord" in plan.config.output_formats:
        from data_prep.tfrecord_writer import encode_examples, write_tfrecord_file
        tfrecord_path = FileSystems.join(out_dir, shard_name(index, plan.num_shards, "tfrecord"))
        sinks["tfrecord"] = _HashingWriter(FileSystems.create(tfrecord_path + ".tmp"))

    rows = 0
    with pq.ParquetWriter(sinks["parquet"], settings.schema(), compression="zstd") as parquet:
        for batch in build_shard(documents, index, settings, stats):
            parquet.write_batch(to_record_batch(batch, settings), row_group_size=PARQUET_ROW_GROUP_ROWS)
            rows += len(batch.num_tokens)
            if tfrecord_path is not None:
                masked = batch.masked
                write_tfrecord_file(sinks["tfrecord"], encode_examples(
                    masked.input_ids, batch.num_tokens, batch.num_tokens_a, masked.positions, masked.labels,
                    masked.num_masked, batch.next_sentence_labels, max_seq_length=settings.instance.max_seq_length,
                    max_predictions_per_seq=settings.masking.max_predictions_per_seq))
    files = {}
    for kind, sink in sinks.items():
        sink.close()
        final = parquet_path if kind == "parquet" else tfrecord_path
        if FileSystems.exists(final):
            FileSystems.delete([final])
        FileSystems.rename([final + ".tmp"], [final])
        files[kind] = dataclasses.asdict(WrittenFile(final.rsplit("/", 1)[-1], sink.size, sink.sha256.hexdigest()))
    return {
        "index": index,
        "documents": len(documents),
        "input_tokens": int(sum(len(doc.token_ids) for doc in documents)),
        "rows": rows,
        "files": files,
        "stats": dataclasses.asdict(stats),
    }
