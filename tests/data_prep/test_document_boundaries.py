"""objective=mlm rows record where each packed document starts (document_starts, manifest format 3): exactly at each
document's first token, [SEP]s belonging to the document they end, the ring's wrap-around a boundary too. BERT's
sentence-pair rows and their manifest stay exactly what they were."""
from __future__ import annotations

import hashlib

import numpy as np
import pyarrow.parquet as pq
import pytest

from data_prep.instances import TokenizedDocument
from data_prep.packing import assemble_packed, pack_documents
from data_prep.run import run

IN_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
CLS, SEP = 101, 102


def docs(*lengths: int) -> list[TokenizedDocument]:
    """Documents whose tokens are all distinct (ids from 1000 on), so a token says which document it is in."""
    made, next_id = [], 1000
    for i, n in enumerate(lengths):
        made.append(TokenizedDocument(f"d:{i}", np.arange(next_id, next_id + n, dtype=np.int32),
                                      np.array([n], dtype=np.int64)))
        next_id += n
    return made


def rows_with_starts(documents, max_seq_length, dupe_factor, shard_index=0):
    packed = pack_documents(documents, shard_index, max_seq_length, dupe_factor, seed=3, sep_id=SEP)
    ids, num_tokens, starts, counts = assemble_packed(packed, slice(None), CLS, SEP, max_seq_length)
    return ids, num_tokens, np.split(starts, np.cumsum(counts)[:-1])


def expected_starts(row: np.ndarray, length: int, first_tokens: set[int]) -> list[int]:
    """0, then every position from 2 on whose token is a document's first (position 1 joins [CLS]'s document)."""
    return [0] + [p for p in range(2, length - 1) if int(row[p]) in first_tokens]


@pytest.mark.parametrize(("lengths", "max_seq_length", "dupe_factor"), [
    ((40, 3, 1, 25, 60, 9), 16, 3),      # documents shorter than a row, longer than one, of one token
    ((5, 4), 128, 2),                    # a shard shorter than one sequence: its second copy starts mid-ring
    ((300,), 32, 2),                     # one document: only the wrap-around starts it again
])
def test_each_boundary_is_exactly_at_a_documents_first_token(lengths, max_seq_length, dupe_factor):
    documents = docs(*lengths)
    first_tokens = {int(doc.token_ids[0]) for doc in documents}
    last_tokens = {int(doc.token_ids[-1]) for doc in documents}
    ids, num_tokens, starts = rows_with_starts(documents, max_seq_length, dupe_factor)
    wraps = 0
    for row, length, row_starts in zip(ids, num_tokens, starts):
        assert row_starts.tolist() == expected_starts(row, int(length), first_tokens)
        for p in row_starts[1:]:
            before = int(row[p - 1])
            # a [SEP] ends the document before (and belongs to it), or the ring wrapped from the last document
            assert before == SEP or before in last_tokens
            wraps += before != SEP
        # every [SEP] inside the body is followed by a document start
        separators = [p for p in range(1, int(length) - 2) if row[p] == SEP]
        assert all(p + 1 in row_starts for p in separators if p + 1 >= 2)
    assert wraps >= 1   # every configuration above wraps around the ring somewhere


def test_the_ordinals_of_the_documents_in_a_row_follow_its_boundaries():
    ids, num_tokens, starts = rows_with_starts(docs(7, 2, 30, 11), 24, 1)
    for row, row_starts in zip(ids, starts):
        document_of = np.searchsorted(row_starts, np.arange(len(row)), side="right") - 1
        text = row[1:-1] >= 1000
        # within one document, the text tokens are consecutive ids of that document
        for document in np.unique(document_of[1:-1]):
            tokens = row[1:-1][(document_of[1:-1] == document) & text]
            assert (np.diff(tokens) == 1).all()


def job(corpus, out, *extra):
    return run([f"inputs=[{{path: '{corpus}/sentences', format: sentences}}, {{path: '{corpus}/records.jsonl'}}]",
                f"output_dir={out}", "preset=phase1", "num_shards=2", "objective=mlm", "masking=dynamic",
                "dupe_factor=1", *extra, *IN_PROCESS])


def test_the_job_writes_document_starts_and_format_3(corpus, tmp_path, bert_vocab):
    manifest = job(corpus, tmp_path / "out", "max_seq_length=64", "max_predictions_per_seq=10")
    assert manifest["format_version"] == 3
    assert manifest["schema"] == {"input_ids": "list<item: int16>", "document_starts": "list<item: int16>"}
    assert manifest["tokenizer"]["kind"] == "wordpiece"
    tokenizer_json = (tmp_path / "out" / "tokenizer.json").read_bytes()
    assert manifest["tokenizer"]["tokenizer_sha256"] == hashlib.sha256(tokenizer_json).hexdigest()
    sep = bert_vocab.index("[SEP]")
    boundaries = after_separator = 0
    for shard in manifest["shards"]:
        for row in pq.read_table(tmp_path / "out" / shard["parquet"]["path"]).to_pylist():
            starts, ids = row["document_starts"], row["input_ids"]
            assert starts[0] == 0 and starts == sorted(set(starts)) and starts[-1] < len(ids) - 1
            assert 1 not in starts
            boundaries += len(starts) - 1
            after_separator += sum(ids[p - 1] == sep for p in starts[1:])
            # every document-separating [SEP] in the body (not the row's last token) precedes a start
            assert all(p + 1 in starts for p in range(2, len(ids) - 2) if ids[p] == sep)
    assert boundaries > 30 and boundaries - after_separator <= 2   # only the rings' wrap-arounds lack a [SEP]


# The bundled sample's rows as the BERT data path wrote them before document boundaries existed (decoded content of
# each shard, so that a new Parquet or zstd version does not change them; a new tokenizers or BlingFire may).
SAMPLE_CONTENT_SHA256 = [
    "8e87c9145dd1bd92d518ce40dc7102b5a5434dd8147eff8a25b77da4efbb8a7a",
    "823db5e03c225a7e6d05687370cdfe11d97732dd06896540eea05119474956e4",
    "9597caeda05e86058a126b34ffbd9f9a2287b50eb699df9cb9dbff6162a16627",
    "a7d1cb41823ac30ac4d4c9b83a5d6f77d1c1610881239277ecccb8d05d49c9f9",
]
LEGACY_TOKENIZER_KEYS = ["vocab_file", "tokenizer_file", "vocab_size", "vocab_sha256", "lowercase", "source"]


def content_sha256(path) -> str:
    table = pq.read_table(path)
    digest = hashlib.sha256()
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        digest.update(name.encode())
        if hasattr(column, "offsets"):
            digest.update(column.offsets.to_numpy().astype(np.int64).tobytes())
            digest.update(column.values.to_numpy().tobytes())
        else:
            digest.update(column.to_numpy().tobytes())
    return digest.hexdigest()


def test_the_bert_sample_is_what_it_was(tmp_path):
    manifest = run([f"output_dir={tmp_path / 'sample'}", *IN_PROCESS])
    assert manifest["format_version"] == 1
    assert list(manifest["tokenizer"]) == LEGACY_TOKENIZER_KEYS and "tokenizer" not in manifest["parameters"]
    assert list(manifest["schema"]) == ["input_ids", "num_tokens_a", "next_sentence_label", "masked_lm_positions",
                                        "masked_lm_ids"]
    assert [content_sha256(tmp_path / "sample" / s["parquet"]["path"]) for s in manifest["shards"]] \
        == SAMPLE_CONTENT_SHA256
