"""The Beam graph: files -> documents -> token ids -> buckets -> shards -> manifest.

    ListInputs -> SpreadFiles -> ReadAndTokenize --(shard, doc)--> GroupIntoShards -> WriteShards -> WriteManifest
                                       `--(counter, n)--> SumCounts ----------------------------------^

Each input file is one unit of parallel work; each shard (a random bucket of documents) is another.
"""
from __future__ import annotations

import collections
import logging
import os
import time

import apache_beam as beam
from apache_beam.metrics import Metrics

from data_prep.documents import Repair, Skip
from data_prep.manifest import write_manifest
from data_prep.plan import InputFile, JobPlan
from data_prep.readers import read_documents
from data_prep.seeding import stable_seed
from data_prep.shard_files import decode_document, encode_document, shard_settings, write_shard
from data_prep.tokenization import WordPieceEncoder, tokenize_document

log = logging.getLogger(__name__)
COUNTS = "counts"
_REPAIRS = {repair.value for repair in Repair}


def counter_name(skip: Skip) -> str:
    return ("repaired/" if skip.reason in _REPAIRS else "skipped/") + skip.reason


class ReadAndTokenize(beam.DoFn):
    """One input file -> (shard index, encoded tokenized document) pairs, and counts of what happened."""

    def __init__(self, plan: JobPlan):
        self.plan = plan

    def setup(self):
        # Beam parallelises over processes; one tokenizer thread each avoids oversubscribing the cores.
        os.environ.setdefault("RAYON_NUM_THREADS", "1")
        tokens = self.plan.vocab_tokens()
        self.encoder = WordPieceEncoder(tokens, self.plan.config.vocab.lowercase)
        self.token_dtype = shard_settings(self.plan, tokens).token_dtype

    def process(self, input_file: InputFile):
        started = time.perf_counter()
        counts: collections.Counter = collections.Counter(files=1)
        for item in read_documents(input_file.path, input_file.format, input_file.source_name,
                                   text_column=input_file.text_column):
            if isinstance(item, Skip):
                counts[counter_name(item)] += item.count
                continue
            document = tokenize_document(item, self.encoder)
            if document is None:
                counts["skipped/no_tokens"] += 1
                continue
            counts["documents"] += 1
            counts["sentences"] += len(document.sentence_ends)
            counts["input_tokens"] += len(document.token_ids)
            shard = stable_seed(self.plan.config.seed, "shard", document.key) % self.plan.num_shards
            yield shard, encode_document(document, self.token_dtype)
        for name, value in counts.items():
            Metrics.counter("data_prep", name).inc(value)
            yield beam.pvalue.TaggedOutput(COUNTS, (name, value))
        skipped = sum(v for k, v in counts.items() if k.startswith("skipped/"))
        log.info("read %s: %d documents, %d skipped, %d tokens in %.1f s", input_file.source_name,
                 counts["documents"], skipped, counts["input_tokens"], time.perf_counter() - started)


class WriteShards(beam.DoFn):
    def __init__(self, plan: JobPlan):
        self.plan = plan

    def setup(self):
        self.settings = shard_settings(self.plan, self.plan.vocab_tokens())

    def process(self, element):
        index, encoded = element
        started = time.perf_counter()
        documents = [decode_document(e, self.settings.token_dtype) for e in encoded]
        summary = write_shard(documents, index, self.plan, self.settings)
        Metrics.counter("data_prep", "instances").inc(summary["rows"])
        Metrics.counter("data_prep", "shards").inc()
        log.info("wrote shard %d/%d: %d documents, %d instances in %.1f s", index + 1, self.plan.num_shards,
                 summary["documents"], summary["rows"], time.perf_counter() - started)
        yield summary


def build_pipeline(pipeline: beam.Pipeline, plan: JobPlan) -> None:
    read = (
        pipeline
        | "ListInputs" >> beam.Create(list(plan.files))
        | "SpreadFiles" >> beam.Reshuffle()
        | "ReadAndTokenize" >> beam.ParDo(ReadAndTokenize(plan)).with_outputs(COUNTS, main="documents")
    )
    counts = read[COUNTS] | "SumCounts" >> beam.CombinePerKey(sum)
    (
        read.documents
        | "GroupIntoShards" >> beam.GroupByKey()
        | "WriteShards" >> beam.ParDo(WriteShards(plan))
        | "CollectShards" >> beam.combiners.ToList()
        | "WriteManifest" >> beam.Map(write_manifest, plan=plan, counts=beam.pvalue.AsDict(counts))
    )
