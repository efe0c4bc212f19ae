"""data_prep.spill: tokenized documents spilled to disk by bucket, so the graph groups block references only."""
from __future__ import annotations

import os

import numpy as np
import pytest

from data_prep import spill
from data_prep.instances import TokenizedDocument
from data_prep.run import run
from data_prep.spill import SpillWriter, read_blocks, spill_dir

IN_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]


def documents(count: int, dtype=np.int32) -> list[TokenizedDocument]:
    rng = np.random.default_rng(0)
    made = []
    for i in range(count):
        ids = rng.integers(0, 30000, size=int(rng.integers(1, 400)))
        ends = np.unique(np.append(rng.integers(1, len(ids) + 1, size=3), len(ids)))
        made.append(TokenizedDocument(f"wiki/AA/wiki_0{i % 3}:{i}", ids.astype(dtype), ends.astype(np.int64)))
    return made


@pytest.mark.parametrize("dtype", [np.int16, np.int32])
def test_documents_come_back_from_their_buckets_blocks(tmp_path, monkeypatch, dtype):
    monkeypatch.setattr(spill, "FLUSH_BYTES", 2000)   # many flushes: several blocks per bucket
    docs = documents(60)
    writer = SpillWriter(str(tmp_path / "one.docs"), dtype)
    for i, document in enumerate(docs):
        writer.add(i % 4, document)
    blocks = writer.close()
    assert len(blocks) > 8 and os.listdir(tmp_path) == ["one.docs"]   # the temporary name is gone
    for bucket in range(4):
        back = list(read_blocks([ref for b, ref in blocks if b == bucket], dtype))
        expected = docs[bucket::4]
        assert [d.key for d in back] == [d.key for d in expected]
        for got, want in zip(back, expected):
            assert got.token_ids.dtype == np.int32 and np.array_equal(got.token_ids, want.token_ids)
            assert np.array_equal(got.sentence_ends, want.sentence_ends)


def test_shards_are_the_same_however_often_the_spill_flushes_and_the_spill_is_removed(corpus, tmp_path, monkeypatch):
    args = [f"inputs=[{{path: '{corpus}/sentences', format: sentences}}, {{path: '{corpus}/records.jsonl'}}]",
            "preset=phase1", "num_shards=3", "dupe_factor=2", *IN_PROCESS]
    default = run(args + [f"output_dir={tmp_path / 'a'}"])
    monkeypatch.setattr(spill, "FLUSH_BYTES", 4096)
    flushed = run(args + [f"output_dir={tmp_path / 'b'}"])
    assert [s["parquet"]["sha256"] for s in default["shards"]] == [s["parquet"]["sha256"] for s in flushed["shards"]]
    assert default["totals"] == flushed["totals"]
    assert not os.path.exists(spill_dir(str(tmp_path / "a"))) and not os.path.exists(spill_dir(str(tmp_path / "b")))


def test_a_failed_jobs_spill_is_removed(corpus, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr("data_prep.pipeline.write_shard", broken)
    with pytest.raises(Exception, match="disk full"):
        run([f"inputs=[{corpus}/records.jsonl]", f"output_dir={tmp_path / 'out'}", "preset=phase1",
             "num_shards=2", "dupe_factor=1", *IN_PROCESS])
    assert not os.path.exists(spill_dir(str(tmp_path / "out")))
