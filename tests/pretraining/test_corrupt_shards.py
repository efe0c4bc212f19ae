"""A corrupt shard stops training before step 0, named; and a read failure mid-run names the shard and group."""
from __future__ import annotations

import shutil

import pytest

from pipeline.core.app import compose
from pipeline.pretraining.data.epoch_plan import Piece
from pipeline.pretraining.data.rows import RowGroupReader, ShardReadError
from pipeline.pretraining.data.shard_set import ShardSet
from pipeline.pretraining.data.verify import main as verify_main
from pipeline.pretraining.data.verify import verify_shard_set
from pipeline.pretraining.run import train


def zero_middle(path, size=2048):
    """What the user did: 2 KB of zeros in the middle of a shard (its data pages, not the footer)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle - size // 2:middle + size // 2] = bytes(size)
    path.write_bytes(bytes(data))


@pytest.fixture
def corrupt_set(small_shards, tmp_path):
    copy = shutil.copytree(small_shards, tmp_path / "corrupt")
    shard = sorted(copy.glob("shard-*.parquet"))[0]
    zero_middle(shard)
    return copy, shard


def test_verification_names_the_corrupt_shard_and_times_itself(small_shards, corrupt_set, capsys):
    copy, shard = corrupt_set
    result = verify_shard_set(str(copy))
    assert result.bad_files == [shard.name] and result.files >= 1 and result.bytes > 0
    assert "s per GB" in result.describe()
    assert verify_shard_set(str(small_shards)).bad_files == []
    assert verify_main([str(copy)]) == 1 and shard.name in capsys.readouterr().err
    assert verify_main([str(small_shards)]) == 0


def test_training_refuses_a_corrupt_set_before_step_0(corrupt_set, tmp_path, tiny_overrides):
    copy, shard = corrupt_set
    with pytest.raises(ValueError, match=rf"{shard.name}.*differ from the sizes and sha256.*Nothing was trained"):
        train(compose("train", tiny_overrides(copy, tmp_path / "out", 4)))
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_a_read_failure_names_the_shard_the_row_group_and_the_remedy(corrupt_set, tmp_path, tiny_overrides):
    """With verification off (or a file damaged after it), the failure still says which file and what to do."""
    copy, shard = corrupt_set
    shard_set = ShardSet.open(copy, max_seq_length=128, vocab_size=30522)
    reader = RowGroupReader(shard_set)
    group = next(i for i in range(len(shard_set.row_groups))
                 if shard_set.shards[int(shard_set.row_groups.file[i])].path == str(shard))
    with pytest.raises(ShardReadError,
                       match=rf"row group 0 of shard {shard}.*python -m pipeline.pretraining.data.verify"):
        reader.read_piece(Piece(group, 0, int(shard_set.row_groups.rows[group])))
    with pytest.raises(ShardReadError, match=rf"cannot read row group 0 of shard {shard}.*re-run data_prep"):
        train(compose("train", tiny_overrides(copy, tmp_path / "out", 4, "data.verify_checksums=false")))
