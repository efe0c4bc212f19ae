"""objective=mlm: contiguous text packed into full sequences across sentences and documents ([SEP] between
documents), no NSP label, masking at a configurable rate, static or dynamic; mlm_nsp unchanged."""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from data_prep.instances import TokenizedDocument
from data_prep.masking import MaskingConfig, MaskingVocab, mask_batch, num_to_predict
from data_prep.packing import assemble_packed, pack_documents
from data_prep.run import run

IN_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
CLS, SEP = 101, 102


def docs(*lengths: int) -> list[TokenizedDocument]:
    made, next_id = [], 1000
    for i, n in enumerate(lengths):
        ids = np.arange(next_id, next_id + n, dtype=np.int32)   # every token of the corpus distinct
        next_id += n
        made.append(TokenizedDocument(f"d:{i}", ids, np.array([n], dtype=np.int64)))
    return made


def test_packing_fills_every_sequence_and_covers_the_stream_once_per_copy():
    documents = docs(300, 7, 51, 120)
    packed = pack_documents(documents, shard_index=0, max_seq_length=32, dupe_factor=3, seed=1, sep_id=SEP)
    stream_length = 300 + 7 + 51 + 120 + 3                       # three [SEP]s between four documents
    assert len(packed.stream) == stream_length and packed.body_length == 30
    ids, num_tokens, _, _ = assemble_packed(packed, slice(None), CLS, SEP, 32)
    assert (num_tokens == 32).all()                               # every instance full (the last wraps around)
    assert (ids[:, 0] == CLS).all() and (ids[:, -1] == SEP).all()
    per_copy = -(-stream_length // 30)
    assert len(ids) == 3 * per_copy
    # each copy's windows cover every corpus token; a text token appears at most twice per copy (the wrap)
    counts = np.bincount(ids[:, 1:-1][ids[:, 1:-1] >= 1000].ravel() - 1000, minlength=478)
    assert counts.min() >= 3 and counts.max() <= 6
    # documents are contiguous inside a window, separated by exactly one [SEP]
    body = ids[:, 1:-1]
    for row in body:
        text = row[row != SEP]
        runs = np.split(text, np.flatnonzero(np.diff(text) != 1) + 1)
        assert all(len(r) for r in runs)


def test_a_shard_shorter_than_one_sequence_gives_one_shorter_instance():
    packed = pack_documents(docs(5, 4), shard_index=3, max_seq_length=128, dupe_factor=2, seed=1, sep_id=SEP)
    ids, num_tokens, _, _ = assemble_packed(packed, slice(None), CLS, SEP, 128)
    assert num_tokens.tolist() == [12, 12] and ids[0, :12].tolist().count(SEP) == 2


@pytest.mark.parametrize("rate", [0.15, 0.30])
def test_masking_counts_at_each_rate_and_separators_are_never_masked(rate, bert_vocab):
    vocab = MaskingVocab.from_tokens(bert_vocab, {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"})
    config = MaskingConfig(rate, 40, packed=True)
    packed = pack_documents(docs(200, 30, 90, 5, 70), 0, 128, 4, seed=7, sep_id=SEP)
    ids, num_tokens, _, _ = assemble_packed(packed, slice(None), CLS, SEP, 128)
    masked = mask_batch(ids, num_tokens, num_tokens - 2, packed.seeds, config, vocab)
    assert (masked.num_masked == num_to_predict(num_tokens, config)).all()
    assert (masked.num_masked == round(128 * rate)).all()        # 19 at 0.15, 38 at 0.30
    assert not np.isin(masked_originals(ids, masked), [CLS, SEP]).any()
    unpacked = mask_batch(ids, num_tokens, num_tokens - 2, packed.seeds, MaskingConfig(rate, 40), vocab)
    assert np.isin(masked_originals(ids, unpacked), [SEP]).any()   # without packed=True the separators are fair game


def masked_originals(ids: np.ndarray, masked) -> np.ndarray:
    slots = np.arange(masked.positions.shape[1])[None, :] < masked.num_masked[:, None]
    rows = np.broadcast_to(np.arange(len(ids))[:, None], slots.shape)[slots]
    return ids[rows, masked.positions[slots]]


def job(corpus, out, *extra):
    return run([f"inputs=[{{path: '{corpus}/sentences', format: sentences}}, {{path: '{corpus}/records.jsonl'}}]",
                f"output_dir={out}", "preset=phase1", "num_shards=2", "objective=mlm", *extra, *IN_PROCESS])


def test_static_mlm_shards_have_no_nsp_label_and_full_rows(corpus, tmp_path, bert_vocab):
    manifest = job(corpus, tmp_path / "out", "dupe_factor=2", "masked_lm_prob=0.3", "max_predictions_per_seq=38")
    assert manifest["format_version"] == 3 and manifest["parameters"]["objective"] == "mlm"
    assert "random_next_share" not in manifest["statistics"] and manifest["warnings"] == []
    lengths = []
    for shard in manifest["shards"]:
        table = pq.read_table(tmp_path / "out" / shard["parquet"]["path"])
        assert table.column_names == ["input_ids", "document_starts", "masked_lm_positions", "masked_lm_ids"]
        rows = table.to_pylist()
        lengths.append([len(r["input_ids"]) for r in rows])
        for r in rows:
            assert r["input_ids"][0] == bert_vocab.index("[CLS]") and r["input_ids"][-1] == bert_vocab.index("[SEP]")
            assert len(r["masked_lm_positions"]) == 38
    assert all(set(shard_lengths) == {128} for shard_lengths in lengths)
    assert 0.29 < manifest["statistics"]["masked_token_share"] < 0.30    # 38 of 128


def test_dynamic_mlm_shards_are_unmasked_and_identical_across_runners(corpus, tmp_path, bert_vocab):
    one = job(corpus, tmp_path / "a", "masking=dynamic", "dupe_factor=1")
    two = job(corpus, tmp_path / "b", "masking=dynamic", "dupe_factor=1", "--direct_running_mode=multi_processing",
              "--direct_num_workers=2")
    assert [s["parquet"]["sha256"] for s in one["shards"]] == [s["parquet"]["sha256"] for s in two["shards"]]
    table = pq.read_table(tmp_path / "a" / one["shards"][0]["parquet"]["path"])
    assert table.column_names == ["input_ids", "document_starts"]   # the hashes above cover both
    assert bert_vocab.index("[MASK]") not in set(
        np.concatenate(table.column("input_ids").to_numpy(zero_copy_only=False)))


@pytest.mark.parametrize(("args", "message"), [
    (["masked_lm_prob=0.3"], "set max_predictions_per_seq=38"),
    (["output_formats=[parquet,tfrecord]"], "objective=mlm writes parquet only"),
    (["objective=span"], "objective must be one of"),
])
def test_impossible_mlm_settings_are_refused_before_the_job(corpus, tmp_path, args, message):
    with pytest.raises(ValueError, match=message):
        job(corpus, tmp_path / "out", *args)
