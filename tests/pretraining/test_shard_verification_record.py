"""A run's start-up checks (PretrainChecks, the first thing every start of train() does, requeues included) hash each
shard once: a later start in the same output directory hashes only the shards whose size or mtime changed since.
Counted in bytes through hashlib itself, in the module that hashes them; nothing is timed."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import types

import pytest

import data_prep.manifest
from pipeline.core.app import compose
from pipeline.pretraining.checks import PretrainChecks
from pipeline.pretraining.data.verify import RECORD_NAME


@pytest.fixture
def hashed_bytes(monkeypatch):
    """Bytes fed to sha256 by data_prep.manifest (where shard checksums are computed), since the last reset."""
    counted = [0]

    class CountingSha256:
        def __init__(self):
            self._digest = hashlib.sha256()

        def update(self, data):
            counted[0] += len(data)
            self._digest.update(data)

        def hexdigest(self):
            return self._digest.hexdigest()

    monkeypatch.setattr(data_prep.manifest, "hashlib", types.SimpleNamespace(sha256=CountingSha256))
    return counted


def test_a_second_start_hashes_only_the_shards_that_changed(regrouped_set, tmp_path, tiny_overrides, hashed_bytes):
    shards = shutil.copytree(regrouped_set.path, tmp_path / "shards")     # 3 shard files
    manifest = json.loads((shards / "manifest.json").read_text())
    sizes = {s["parquet"]["path"]: s["parquet"]["bytes"] for s in manifest["shards"]}
    assert len(sizes) == 3
    cfg = compose("train", tiny_overrides(shards, tmp_path / "run", 4))

    PretrainChecks(cfg)                                   # the first start: every shard
    assert hashed_bytes[0] == sum(sizes.values())
    record = json.loads((tmp_path / "run" / RECORD_NAME).read_text())
    assert sorted(os.path.basename(name) for name in record) == sorted(sizes)

    hashed_bytes[0] = 0
    PretrainChecks(cfg)                                   # a requeue: nothing changed, nothing hashed
    assert hashed_bytes[0] == 0

    touched = sorted(sizes)[0]
    stat = (shards / touched).stat()
    os.utime(shards / touched, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))   # e.g. copied back from a backup
    hashed_bytes[0] = 0
    PretrainChecks(cfg)
    assert hashed_bytes[0] == sizes[touched]              # that shard only, once
    hashed_bytes[0] = 0
    PretrainChecks(cfg)
    assert hashed_bytes[0] == 0

    # A shard damaged since is hashed again (its mtime moved) and stops the start, named.
    data = bytearray((shards / touched).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (shards / touched).write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{touched}.*differ from the sizes and sha256"):
        PretrainChecks(cfg)
