"""A run's record of verified shards (verified_shards.json) spares its later starts the hashing of unchanged shards,
but a shard rewritten in place with its size and mtime put back (`cp -p` or `rsync -a` of a bad copy; os.utime here)
is not unchanged: its ctime moved, so the next start hashes it and refuses it, named. data.verify_checksums=full
hashes every shard whatever the record says."""
from __future__ import annotations

import json
import logging
import os
import shutil

import pytest

from pipeline.core.app import compose
from pipeline.pretraining.checks import PretrainChecks


def hashed(caplog) -> list[str]:
    """What each start's verification said (ShardSet.open's log line)."""
    return [r.getMessage().split(": ", 1)[1] for r in caplog.records if r.getMessage().startswith("shard set ")]


def test_a_shard_rewritten_with_its_size_and_mtime_kept_is_hashed_and_refused(regrouped_set, tmp_path,
                                                                                tiny_overrides):
    shards = shutil.copytree(regrouped_set.path, tmp_path / "shards")
    cfg = compose("train", tiny_overrides(shards, tmp_path / "run", 4))
    PretrainChecks(cfg)                                   # the first start: every shard hashed and recorded

    name = json.loads((shards / "manifest.json").read_text())["shards"][1]["parquet"]["path"]
    shard = shards / name
    before = shard.stat()
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF                          # one byte of a bad copy, in place
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))     # size and mtime as they were
    after = shard.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)

    with pytest.raises(ValueError, match=rf"\['{name}'\] differ from the sizes and sha256 in its manifest"):
        PretrainChecks(cfg)


def test_verify_checksums_full_hashes_every_shard_whatever_the_record_says(regrouped_set, tmp_path, tiny_overrides,
                                                                           caplog):
    shards = shutil.copytree(regrouped_set.path, tmp_path / "shards")
    caplog.set_level(logging.INFO, logger="pipeline.pretraining")
    PretrainChecks(compose("train", tiny_overrides(shards, tmp_path / "run", 4)))
    PretrainChecks(compose("train", tiny_overrides(shards, tmp_path / "run", 4)))
    PretrainChecks(compose("train", tiny_overrides(shards, tmp_path / "run", 4, "data.verify_checksums=full")))
    first, requeue, full = hashed(caplog)
    assert " 3 hashed " in first and " 0 hashed " in requeue and " 3 hashed " in full, (first, requeue, full)
    assert "3 unchanged since their recorded check (inode, size, mtime, ctime)" in requeue


def test_a_verify_checksums_value_that_means_nothing_is_refused(tiny_overrides, small_shards, tmp_path):
    with pytest.raises(ValueError, match=r"data.verify_checksums='fast': use true .*, full .* or false"):
        PretrainChecks(compose("train", tiny_overrides(small_shards, tmp_path / "run", 4,
                                                       "data.verify_checksums=fast")))
