"""manifest.json written: what data_prep's Beam job records of a shard set (data_prep.manifest reads it).

Every parameter that shaped the data, the tokenizer and its hash, the row schema, per-shard row counts and checksums,
totals, the statistics, and everything skipped or repaired, by reason (and which files each skip reason came from).
Written whole (data_prep.whole_files) by the job's last step; a job that made no instance writes none
(data_prep.no_instances).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any

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
