"""The Beam graph: files -> documents -> token ids -> buckets (spilled to disk) -> shards -> manifest.

    ListInputs -> SpreadFiles -> ReadAndTokenize -> KeepBlocks -> GroupIntoShards -> WriteShards --.
                                       `-----------> KeepCounts ----------------------------------------+
    WriteManifest <- CollectManifestParts <- JoinManifestParts <----------------------------------------'

WriteManifest writes no manifest for a job that made no instance: data_prep.no_instances says why instead.

Each input file is one unit of parallel work; each shard (a random bucket of documents) is another. The tokenized
documents never pass through the graph: each file's reader spills them to disk in blocks by bucket (data_prep.spill)
and the graph groups the blocks' references, so no step holds more than one bucket, whatever the corpus size.

The graph uses no multi-output ParDo and no side input, on purpose: Beam's Dask runner (2.77) handles neither.
Its DaskBagVisitor keys the Dask bags by producing transform, so every output PCollection of a ParDo is the same
bag, and apply_dofn_to_bundle unwraps TaggedOutput values and drops their tag: every consumer of any output gets
the elements of all outputs (the (name, count) pairs reached GroupIntoShards and WriteShards failed in
decode_document). And it evaluates a side input by computing the side input's bag inside the consuming task, which
re-runs the whole upstream graph (ToList's default-injecting side input and AsDict(counts) re-read every file). So
ReadAndTokenize emits one stream of (kind, payload) elements, split by two filters, and the manifest's two inputs
meet through Flatten and one global combine without defaults. Every runner runs this graph the same way.
"""
from __future__ import annotations

import collections
import logging
import os
import time

import apache_beam as beam
from apache_beam.metrics import Metrics

from data_prep.documents import INPUT_PROBLEMS, Document, Repair, Skip, SkipReason
from data_prep.manifest_writer import write_manifest
from data_prep.no_instances import write_no_instances_report
from data_prep.plan import InputFile, JobPlan
from data_prep.readers import read_documents
from data_prep.seeding import stable_seed
from data_prep.shard_files import shard_settings, write_shard
from data_prep.spill import SpillWriter, read_blocks, spill_path
from data_prep.tokenization import (
    TokenizerJsonEncoder,
    WordPieceEncoder,
    document_sentences,
    sentences_within,
    tokenize_sentences,
)
from data_prep.vocab import TOKENIZER_JSON
from data_prep.where_skipped import FileSkips

log = logging.getLogger(__name__)
# What an element of ReadAndTokenize's output or of the manifest's input is: (kind, payload).
BLOCK = "block"         # (shard index, BlockRef): one input file's documents of that shard, on disk
COUNT = "count"         # (counter name, value) for one input file
SHARD = "shard"         # a written shard's manifest entry
SKIPPED_IN = "skipped_in"   # (reason, source name, count, first detail) for one input file (data_prep.where_skipped)
_REPAIRS = {repair.value for repair in Repair}


def counter_name(skip: Skip) -> str:
    return ("repaired/" if skip.reason in _REPAIRS else "skipped/") + skip.reason


class ReadAndTokenize(beam.DoFn):
    """One input file -> its tokenized documents spilled to disk, (BLOCK, (shard index, BlockRef)) elements
    saying where each shard's part lies, then (COUNT, (name, value)) and (SKIPPED_IN, note) elements saying what
    happened in the file."""

    def __init__(self, plan: JobPlan):
        self.plan = plan

    def setup(self):
        # Beam parallelises over processes; one tokenizer thread each avoids oversubscribing the cores.
        os.environ.setdefault("RAYON_NUM_THREADS", "1")
        tokens = self.plan.vocab_tokens()
        if self.plan.tokenizer_kind == TOKENIZER_JSON:
            self.encoder = TokenizerJsonEncoder(self.plan.tokenizer_json())
        else:
            self.encoder = WordPieceEncoder(tokens, self.plan.config.vocab.lowercase)
        self.token_dtype = shard_settings(self.plan, tokens).token_dtype

    def process(self, input_file: InputFile):
        started = time.perf_counter()
        counts: collections.Counter = collections.Counter(files=1)
        skips = FileSkips(input_file.source_name)
        max_line_chars = self.plan.config.max_line_chars
        spill = SpillWriter(spill_path(self.plan.config.output_dir, input_file.path), self.token_dtype)
        for item in read_documents(input_file.path, input_file.format, input_file.source_name,
                                   text_column=input_file.text_column, max_line_chars=max_line_chars):
            if isinstance(item, Skip):
                counts[counter_name(item)] += item.count
                skips.add(item)
                continue
            document, skipped = self.tokenize(item, input_file.source_name, max_line_chars)
            for skip in skipped:
                counts[counter_name(skip)] += skip.count
                skips.add(skip)
            if document is None:
                continue
            counts["documents"] += 1
            counts["sentences"] += len(document.sentence_ends)
            counts["input_tokens"] += len(document.token_ids)
            shard = stable_seed(self.plan.config.seed, "shard", document.key) % self.plan.num_shards
            spill.add(shard, document)
        for shard, block in spill.close():
            yield BLOCK, (shard, block)
        for name, value in counts.items():
            Metrics.counter("data_prep", name).inc(value)
            yield COUNT, (name, value)
        for note in skips.notes():
            reason, source, count, detail = note
            if reason in INPUT_PROBLEMS:
                log.warning("%s: %d skipped as %s%s", source, count, reason, f" ({detail})" if detail else "")
            yield SKIPPED_IN, note
        skipped = sum(v for k, v in counts.items() if k.startswith("skipped/"))
        log.info("read %s: %d documents, %d skipped, %d tokens in %.1f s", input_file.source_name,
                 counts["documents"], skipped, counts["input_tokens"], time.perf_counter() - started)

    def tokenize(self, item: Document, source_name: str, max_line_chars: int):
        """(the tokenized document or None, the Skips of what was left out of it)."""
        sentences, too_long = sentences_within(document_sentences(item), max_line_chars)
        skipped = []
        if too_long:
            skipped.append(Skip(SkipReason.SENTENCE_TOO_LONG.value, source_name, count=len(too_long),
                                detail=f"document {item.key}: longer than max_line_chars={max_line_chars:,}, "
                                       f"the longest {max(too_long):,} characters"))
        document = tokenize_sentences(item.key, sentences, self.encoder)
        if document is None:
            skipped.append(Skip(SkipReason.NO_TOKENS.value, source_name, detail=f"document {item.key}"))
        return document, skipped


class WriteShards(beam.DoFn):
    def __init__(self, plan: JobPlan):
        self.plan = plan

    def setup(self):
        self.settings = shard_settings(self.plan, self.plan.vocab_tokens())

    def process(self, element):
        index, blocks = element
        started = time.perf_counter()
        documents = list(read_blocks(list(blocks), self.settings.token_dtype))
        summary = write_shard(documents, index, self.plan, self.settings)
        Metrics.counter("data_prep", "instances").inc(summary["rows"])
        Metrics.counter("data_prep", "shards").inc()
        log.info("wrote shard %d/%d: %d documents, %d instances in %.1f s", index + 1, self.plan.num_shards,
                 summary["documents"], summary["rows"], time.perf_counter() - started)
        yield SHARD, summary


def payloads_of_kind(element: tuple[str, object], kind: str):
    if element[0] == kind:
        yield element[1]


def is_file_report(element: tuple[str, object]) -> bool:
    return element[0] in (COUNT, SKIPPED_IN)


def write_manifest_from_parts(parts: list[tuple[str, object]], plan: JobPlan) -> str:
    """The manifest from every shard's entry and every file's counts (summed here: a few per input file) and skip
    notes; for a job that made no instance, the report of data_prep.no_instances instead."""
    shards = [payload for kind, payload in parts if kind == SHARD]
    notes = [payload for kind, payload in parts if kind == SKIPPED_IN]
    counts: collections.Counter = collections.Counter()
    for kind, payload in parts:
        if kind == COUNT:
            name, value = payload
            counts[name] += value
    if not sum(shard["rows"] for shard in shards):
        return write_no_instances_report(shards, plan, dict(counts), notes)
    return write_manifest(shards, plan, dict(counts), notes)


def build_pipeline(pipeline: beam.Pipeline, plan: JobPlan) -> None:
    read = (
        pipeline
        | "ListInputs" >> beam.Create(list(plan.files))
        | "SpreadFiles" >> beam.Reshuffle()
        | "ReadAndTokenize" >> beam.ParDo(ReadAndTokenize(plan))
    )
    shards = (
        read
        | "KeepBlocks" >> beam.FlatMap(payloads_of_kind, BLOCK)
        | "GroupIntoShards" >> beam.GroupByKey()
        | "WriteShards" >> beam.ParDo(WriteShards(plan))
    )
    counts = read | "KeepCounts" >> beam.Filter(is_file_report)
    (
        (shards, counts)
        | "JoinManifestParts" >> beam.Flatten()
        # Never empty (every input file has a count), so no default value, and with it no side input.
        | "CollectManifestParts" >> beam.CombineGlobally(beam.combiners.ToListCombineFn()).without_defaults()
        | "WriteManifest" >> beam.Map(write_manifest_from_parts, plan=plan)
    )
