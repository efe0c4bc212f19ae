"""Fixtures of the pre-training data tests."""
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.shard_sets import SMALL_BOOKS, shared_books_set
from tests.helpers.shared_builds import built_once


@pytest.fixture(scope="session")
def regrouped_set(tmp_path_factory, shared_data):
    """The real static set (one shard, one row group) rewritten as 3 shard files of 64-row groups (27 groups), so
    that shares start and end inside row groups, resuming can skip whole groups and buffers, and a share is cut
    into several shuffle buffers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.pretraining.data.shard_set import ShardSet

    books = [shared_data / "corpora" / "books" / name for name in SMALL_BOOKS]
    source = shared_books_set(tmp_path_factory, "static", books)
    target = tmp_path_factory.mktemp("regrouped")
    for name in ("vocab.txt", "tokenizer.json"):
        shutil.copy(source / name, target / name)
    manifest = json.loads((source / "manifest.json").read_text())
    table = pa.concat_tables(pq.read_table(source / s["parquet"]["path"]) for s in manifest["shards"])
    bounds = np.linspace(0, table.num_rows, 4).astype(int)
    manifest["shards"] = []
    for index in range(3):
        name = f"shard-{index:05d}-of-00003.parquet"
        pq.write_table(table.slice(bounds[index], bounds[index + 1] - bounds[index]), target / name,
                       row_group_size=64)
        data = (target / name).read_bytes()
        manifest["shards"].append({"index": index, "rows": int(bounds[index + 1] - bounds[index]), "documents": 0,
                                   "parquet": {"path": name, "bytes": len(data),
                                               "sha256": hashlib.sha256(data).hexdigest()}})
    (target / "manifest.json").write_text(json.dumps(manifest))
    shard_set = ShardSet.open(target, max_seq_length=128, vocab_size=30522)
    assert len(shard_set.row_groups) == 27 and shard_set.total_rows == table.num_rows
    return shard_set


@pytest.fixture(scope="session")
def wiki_shards(tmp_path_factory, shared_data):
    """A phase-1 shard set made by the real data job from the real Wikipedia sample: short articles make rows of
    many lengths (every row of a book's set has 128 tokens), so batches of one row have different widths."""
    dump = next((shared_data / "corpora" / "wikipedia").glob("enwiki-*.xml-*.bz2"))
    options = ["preset=phase1", "num_shards=2", "dupe_factor=1", "--runner=DirectRunner",
               "--direct_running_mode=in_memory"]

    def build(out: Path) -> None:
        from data_prep.run import run
        run([f"inputs=[{{path: '{dump}', format: wikipedia}}]", f"output_dir={out}", *options])

    return built_once(tmp_path_factory, "wiki_shards", [str(dump), options], build, leaf="phase1")
