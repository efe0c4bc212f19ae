"""ShardSet.open on real shard sets from data_prep: what it exposes, and every set it must refuse, with why."""
import json
import shutil

import pytest

from pipeline.pretraining.data.shard_set import ShardSet
from tests.helpers.shard_sets import SMALL_BOOKS, shared_books_set


@pytest.fixture(scope="session")
def static_set(tmp_path_factory, shared_data):
    books = [shared_data / "corpora" / "books" / name for name in SMALL_BOOKS]
    return shared_books_set(tmp_path_factory, "static", books)


def edited_copy(source, target, edit):
    """A copy of the set whose manifest went through `edit`."""
    shutil.copytree(source, target)
    manifest = json.loads((target / "manifest.json").read_text())
    edit(manifest)
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def test_open_exposes_the_manifest_shards_row_groups_and_special_tokens(static_set, bert_vocab):
    shard_set = ShardSet.open(static_set, max_seq_length=128, vocab_size=30522)
    manifest = json.loads((static_set / "manifest.json").read_text())
    assert shard_set.manifest == manifest
    assert shard_set.masking == "static" and shard_set.max_predictions_per_seq == 20 and shard_set.max_seq_length == 128
    assert shard_set.total_rows == manifest["totals"]["instances"] == sum(s.rows for s in shard_set.shards)
    assert [s.rows for s in shard_set.shards] == [s["rows"] for s in manifest["shards"]]
    assert all(str(static_set) in s.path for s in shard_set.shards)
    groups = shard_set.row_groups
    assert groups.rows.sum() == shard_set.total_rows and groups.first_row[0] == 0
    assert list(groups.first_row[1:]) == list(groups.rows.cumsum()[:-1])
    special = shard_set.special_tokens
    assert (special.pad, special.cls, special.sep, special.mask) == tuple(
        bert_vocab.index(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]"))
    assert shard_set.masking_vocab.mask_id == special.mask
    assert len(shard_set.masking_vocab.is_continuation) == len(bert_vocab)
    assert shard_set.masking_config.max_predictions_per_seq == 20


def test_a_set_of_another_sequence_length_is_refused_with_both_lengths_and_the_fix(static_set):
    with pytest.raises(ValueError) as error:
        ShardSet.open(static_set, max_seq_length=512, vocab_size=30522)
    message = str(error.value)
    assert "max_seq_length=128" in message and "max_seq_length=512" in message
    assert "data.max_seq_length=128" in message            # the config key to change ...
    assert "python data_prep/run.py preset=phase2" in message   # ... or the preset that writes seq 512


def test_a_set_of_another_vocabulary_size_is_refused_with_both_sizes_and_the_fix(static_set):
    with pytest.raises(ValueError) as error:
        ShardSet.open(static_set, max_seq_length=128, vocab_size=32000)
    message = str(error.value)
    assert "30522" in message and "32000" in message and "model.vocab_size=30522" in message


def test_an_unknown_format_version_is_refused(static_set, tmp_path):
    future = edited_copy(static_set, tmp_path / "future", lambda m: m.update(format_version=99))
    with pytest.raises(ValueError, match="format_version 99"):
        ShardSet.open(future, max_seq_length=128, vocab_size=30522)


@pytest.mark.parametrize("make_dir", [False, True])
def test_a_missing_set_says_how_to_prepare_it(tmp_path, make_dir):
    path = tmp_path / "shards"
    if make_dir:
        path.mkdir()   # the directory exists but the job never finished: no manifest
    with pytest.raises(FileNotFoundError) as error:
        ShardSet.open(path, max_seq_length=128, vocab_size=30522)
    assert f"python data_prep/run.py preset=phase1 inputs='[...]' output_dir={path}" in str(error.value)


def test_missing_truncated_or_corrupted_shards_and_a_changed_vocabulary_are_refused(static_set, tmp_path):
    missing = shutil.copytree(static_set, tmp_path / "missing")
    next(missing.glob("shard-*.parquet")).unlink()
    with pytest.raises(FileNotFoundError, match="listed in the manifest but missing"):
        ShardSet.open(missing, max_seq_length=128, vocab_size=30522)

    def claim_more_rows(manifest):
        manifest["shards"][0]["rows"] += 1
    with pytest.raises(ValueError, match="manifest says"):
        ShardSet.open(edited_copy(static_set, tmp_path / "rows", claim_more_rows), max_seq_length=128, vocab_size=30522)

    def wrong_checksum(manifest):
        manifest["shards"][0]["parquet"]["sha256"] = "0" * 64
    corrupted = edited_copy(static_set, tmp_path / "checksum", wrong_checksum)
    ShardSet.open(corrupted, max_seq_length=128, vocab_size=30522)    # hashing the set is opt-in
    with pytest.raises(ValueError, match="differ from the sizes and sha256"):
        ShardSet.open(corrupted, max_seq_length=128, vocab_size=30522, verify_checksums=True)
    ShardSet.open(static_set, max_seq_length=128, vocab_size=30522, verify_checksums=True)

    changed = shutil.copytree(static_set, tmp_path / "vocab")
    tokens = (changed / "vocab.txt").read_text().splitlines()
    tokens[2000], tokens[2001] = tokens[2001], tokens[2000]
    (changed / "vocab.txt").write_text("\n".join(tokens) + "\n")
    with pytest.raises(ValueError, match="differs from the vocabulary the shards were written with"):
        ShardSet.open(changed, max_seq_length=128, vocab_size=30522)
