"""manifest.json: the contract between data_prep and training.

It records every parameter that shaped the data, the tokenizer and its hash, the row schema, per-shard row
counts and checksums, totals, the statistics, and everything skipped or repaired, by reason (and which files each
skip reason came from). Training opens a shard set through it and refuses one whose parameters do not fit its
config. A job that made no instance writes none (data_prep.no_instances).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import hashlib
import json
import os
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from data_prep.layout import MANIFEST_NAME, TOKENIZER_NAME, VOCAB_NAME
from data_prep.plan import JobPlan
from data_prep.shard_files import shard_settings
from data_prep.stats import InstanceStats
from data_prep.vocab import WORDPIECE
from data_prep.where_skipped import SkipNote, skipped_where
from data_prep.whole_files import write_whole

FORMAT_VERSION = 1          # sentence pairs with next-sentence labels (objective mlm_nsp)
# objective mlm: rows of input_ids (and masking) only. 2: as first written; 3: with each row's document_starts
# (data_prep/packing.py), which readers of 2 would not know to keep documents apart by. A reader must refuse a
# version it does not know.
MLM_FORMAT_VERSION = 3
_HASH_CHUNK_BYTES = 4 << 20


class UnreadableManifest(ValueError):
    """A manifest.json that is there but is not a whole manifest (cut off, or not JSON): the set cannot be used."""


def counts_by_reason(counts: dict[str, int], kind: str) -> dict[str, int]:
    """The ``skipped`` or ``repaired`` counts by reason, from the job's counters ('skipped/binary_file': 2, ...)."""
    return {name.split("/", 1)[1]: value for name, value in sorted(counts.items()) if name.startswith(f"{kind}/")}


def build_manifest(shards: list[dict], plan: JobPlan, counts: dict[str, int], notes: list[SkipNote] = ()
                   ) -> dict[str, Any]:
    shards = sorted(shards, key=lambda s: s["index"])
    stats = InstanceStats()
    for shard in shards:
        stats = stats.merge(InstanceStats(**shard["stats"]))
    settings = shard_settings(plan, plan.vocab_tokens())
    with_nsp = plan.config.objective == "mlm_nsp"
    statistics = stats.summary()
    if with_nsp:
        statistics["expected_random_next_share"] = stats.expected_random_next_share(plan.config.random_next_prob)
    else:   # no sentence pairs: nothing of the next-sentence kind to report
        for name in ("short_target_share", "random_next_share"):
            statistics.pop(name)
    return {
        "format_version": FORMAT_VERSION if with_nsp else MLM_FORMAT_VERSION,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "parameters": plan.config.data_parameters(),
        "tokenizer": tokenizer_section(plan),
        "schema": {field.name: str(field.type) for field in settings.schema()},
        "inputs": [dataclasses.asdict(f) for f in plan.files],
        "num_shards_planned": plan.num_shards,   # buckets no document fell into write no file
        "sizing": plan.sizing,                   # how num_shards_planned was chosen (data_prep.shard_sizing)
        "shards": [{"index": s["index"], "rows": s["rows"], "documents": s["documents"], **s["files"]} for s in shards],
        "totals": {
            "instances": stats.instances,
            "tokens": stats.tokens,
            "masked_tokens": stats.masked_tokens,
            "documents": counts.get("documents", 0),
            "sentences": counts.get("sentences", 0),
            "input_tokens": counts.get("input_tokens", 0),
            "files": counts.get("files", 0),
            "one_sentence_chunk_instances": stats.one_sentence_chunk_instances,
            "random_next_from_same_document": stats.random_next_from_same_document,
            "chunks_without_random_document": stats.chunks_without_random_document,
        },
        "statistics": statistics,
        "warnings": [w for w in (stats.random_next_warning(plan.config.random_next_prob),) if w and with_nsp],
        "skipped": counts_by_reason(counts, "skipped"),
        "skipped_where": skipped_where(notes),     # which files, per reason (data_prep.where_skipped)
        "repaired": counts_by_reason(counts, "repaired"),
    }


def tokenizer_section(plan: JobPlan) -> dict[str, Any]:
    """What made the token ids. BERT's sentence-pair sets of a WordPiece vocabulary keep the section they always
    had (their tokenizer.json is built from vocab.txt, which vocab_sha256 pins); every other set also says which
    kind of tokenizer it was and the sha256 of the tokenizer.json it holds, which training checks."""
    section = {
        "vocab_file": VOCAB_NAME,
        "tokenizer_file": TOKENIZER_NAME,
        "vocab_size": plan.vocab_size,
        "vocab_sha256": plan.vocab_sha256,
        # A tokenizer.json's own normalizer decides the case: vocab.lowercase shapes nothing there.
        "lowercase": plan.config.vocab.lowercase if plan.tokenizer_kind == WORDPIECE else None,
        "source": plan.vocab_source,
    }
    if plan.config.objective != "mlm_nsp" or plan.tokenizer_kind != WORDPIECE:
        section.update(kind=plan.tokenizer_kind, tokenizer_sha256=plan.tokenizer_sha256)
    return section


def write_manifest(shards: list[dict], plan: JobPlan, counts: dict[str, int], notes: list[SkipNote] = ()) -> str:
    """Written whole or not at all: a job killed while writing it leaves the set's earlier manifest (or none), never
    a cut-off one that training would read as a broken set."""
    path = FileSystems.join(plan.config.output_dir, MANIFEST_NAME)
    write_whole(path, json.dumps(build_manifest(shards, plan, counts, notes), indent=2).encode("utf-8"))
    return path


def read_manifest(shard_dir: str) -> dict[str, Any]:
    path = FileSystems.join(shard_dir, MANIFEST_NAME)
    if not FileSystems.exists(path):
        raise FileNotFoundError(f"no {MANIFEST_NAME} in {shard_dir}: not a shard set written by data_prep")
    with FileSystems.open(path) as handle:
        data = handle.read()
    try:
        manifest = json.loads(data.decode("utf-8"))
    except ValueError as error:     # JSONDecodeError, UnicodeDecodeError
        manifest, why = None, f"{type(error).__name__}: {error}"
    else:
        why = f"JSON of type {type(manifest).__name__}, not an object"
    if not isinstance(manifest, dict):
        # A data prep killed while writing it (before manifests were written whole), a full disk, a partial copy.
        raise UnreadableManifest(
            f"{path} is not a whole manifest ({len(data)} bytes; {why}): the shard set in {shard_dir} cannot be "
            f"used as it is. Re-run data prep into it (python data_prep/run.py ... output_dir={shard_dir}) to write "
            "its shards and manifest again.")
    return manifest


def existing_manifest(shard_dir: str) -> dict[str, Any] | None:
    """The manifest of the shard set already in `shard_dir`; None when there is none (or it is not readable JSON:
    then nothing of it can be kept)."""
    try:
        return read_manifest(shard_dir)
    except (FileNotFoundError, OSError, ValueError):
        return None


def verify_checksums(shard_dir: str, manifest: dict[str, Any] | None = None, threads: int | None = None) -> list[str]:
    """Names of shard files whose size or sha256 differs from the manifest (empty when all are intact).

    Files are hashed in parallel threads (hashlib and file reads release the GIL), so a set is checked at the
    speed of its storage rather than of one core. A missing or unreadable file counts as differing.
    """
    return verify_files(shard_dir, shard_file_entries(manifest or read_manifest(shard_dir)), threads)


def shard_file_entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest's entry ({"path", "bytes", "sha256"}) of every shard file, Parquet and TFRecord."""
    return [shard[kind] for shard in manifest["shards"] for kind in ("parquet", "tfrecord") if kind in shard]


def verify_files(shard_dir: str, entries: list[dict[str, Any]], threads: int | None = None) -> list[str]:
    """verify_checksums for the given manifest entries only."""
    threads = threads or min(8, os.cpu_count() or 1, max(len(entries), 1))
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        intact = list(pool.map(lambda entry: _file_matches(shard_dir, entry), entries))
    return [entry["path"] for entry, ok in zip(entries, intact) if not ok]


def _file_matches(shard_dir: str, entry: dict[str, Any]) -> bool:
    path = FileSystems.join(shard_dir, entry["path"])
    digest, size = hashlib.sha256(), 0
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            while chunk := handle.read(_HASH_CHUNK_BYTES):
                digest.update(chunk)
                size += len(chunk)
                if size > entry["bytes"]:
                    return False
    except OSError:   # missing or unreadable: not the file the manifest describes
        return False
    return size == entry["bytes"] and digest.hexdigest() == entry["sha256"]
