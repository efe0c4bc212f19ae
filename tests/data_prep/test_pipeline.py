"""The whole Beam job on real text: shards, manifest, determinism across runners, TFRecord, bad config."""
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from data_prep.manifest import verify_checksums
from data_prep.presets import REPO_ROOT
from data_prep.run import run

IN_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
TWO_PROCESSES = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]


def job_args(corpus, out, *extra):
    return [
        f"inputs=[{{path: '{corpus}/sentences', format: sentences}}, {{path: '{corpus}/records.jsonl'}}]",
        f"output_dir={out}", "preset=phase1", "num_shards=3", "dupe_factor=2", *extra,
    ]


def test_job_writes_shards_that_match_the_manifest_and_the_data_contract(corpus, tmp_path, bert_vocab):
    manifest = run(job_args(corpus, tmp_path / "out") + IN_PROCESS)
    assert verify_checksums(str(tmp_path / "out")) == []
    assert manifest["totals"]["documents"] == 20 + 20 + 10
    assert manifest["parameters"]["max_seq_length"] == 128 and manifest["parameters"]["dupe_factor"] == 2
    assert manifest["tokenizer"]["vocab_size"] == len(bert_vocab)
    assert (tmp_path / "out" / "vocab.txt").read_text(encoding="utf-8").splitlines() == bert_vocab
    rows = 0
    for shard in manifest["shards"]:
        table = pq.read_table(tmp_path / "out" / shard["parquet"]["path"])
        assert table.num_rows == shard["rows"]
        assert str(table.schema.field("input_ids").type) == "list<element: int16>"
        rows += table.num_rows
        for row in table.slice(0, 200).to_pylist():
            ids, n_a = row["input_ids"], row["num_tokens_a"]
            assert ids[0] == bert_vocab.index("[CLS]") and len(ids) <= 128
            assert ids[n_a + 1] == bert_vocab.index("[SEP]") and ids[-1] == bert_vocab.index("[SEP]")
            assert len(row["masked_lm_positions"]) == min(20, max(1, round(len(ids) * 0.15)))
            assert row["next_sentence_label"] in (0, 1)
    assert rows == manifest["totals"]["instances"] > 0
    assert manifest["skipped"] == {} and manifest["totals"]["chunks_without_random_document"] == 0


def test_same_instances_in_process_and_with_two_worker_processes(corpus, tmp_path):
    one = run(job_args(corpus, tmp_path / "a") + IN_PROCESS)
    two = run(job_args(corpus, tmp_path / "b") + TWO_PROCESSES)
    assert [s["parquet"]["sha256"] for s in one["shards"]] == [s["parquet"]["sha256"] for s in two["shards"]]
    assert one["totals"] == two["totals"]


def test_dynamic_masking_stores_unmasked_instances(corpus, tmp_path, bert_vocab):
    manifest = run(job_args(corpus, tmp_path / "out", "masking=dynamic", "dupe_factor=1") + IN_PROCESS)
    table = pq.read_table(tmp_path / "out" / manifest["shards"][0]["parquet"]["path"])
    assert table.column_names == ["input_ids", "num_tokens_a", "next_sentence_label"]
    assert bert_vocab.index("[MASK]") not in set(
        np.concatenate(table.column("input_ids").to_numpy(zero_copy_only=False)))


def test_tfrecord_shards_hold_the_parquet_instances_in_the_reference_layout(corpus, tmp_path):
    from tfrecord.reader import tfrecord_loader
    manifest = run(job_args(corpus, tmp_path / "out", "output_formats=[parquet,tfrecord]") + IN_PROCESS)
    shard = manifest["shards"][0]
    rows = pq.read_table(tmp_path / "out" / shard["parquet"]["path"]).to_pylist()
    description = {"input_ids": "int", "input_mask": "int", "segment_ids": "int", "masked_lm_positions": "int",
                   "masked_lm_ids": "int", "masked_lm_weights": "float", "next_sentence_labels": "int"}
    examples = list(tfrecord_loader(str(tmp_path / "out" / shard["tfrecord"]["path"]), None, description))
    assert len(examples) == len(rows) == shard["rows"]
    for row, example in zip(rows, examples):
        n = len(row["input_ids"])
        assert example["input_ids"].tolist() == row["input_ids"] + [0] * (128 - n)
        a = row["num_tokens_a"] + 2
        assert example["segment_ids"].tolist() == [0] * a + [1] * (n - a) + [0] * (128 - n)
        k = len(row["masked_lm_positions"])
        assert example["masked_lm_positions"].tolist() == row["masked_lm_positions"] + [0] * (20 - k)
        assert example["masked_lm_ids"].tolist() == row["masked_lm_ids"] + [0] * (20 - k)
        assert example["next_sentence_labels"].tolist() == [row["next_sentence_label"]]


def run_cli(*args):
    return subprocess.run([sys.executable, str(REPO_ROOT / "data_prep" / "run.py"), *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,message", [
    (["inputs=[/no/such/dir/*.txt]", "output_dir=/tmp/x", "preset=phase1"], "matched no files"),
    (["masked_lm_prob=2"], "masked_lm_prob must be in (0, 1)"),
    (["max_predictions_per_seq=0"], "max_predictions_per_seq"),
    (["preset=nope"], "unknown preset"),
    (["+colour=blue"], "unknown data_prep option"),
    (["preset=phase1"], "must be given"),
    (["masking=dynamic", "output_formats=[parquet,tfrecord]"], "tfrecord output needs static masking"),
    (["vocab.file=/no/vocab.txt"], "does not exist"),
])
def test_bad_options_fail_before_the_pipeline_starts_with_a_clear_message(args, message, tmp_path):
    result = run_cli(*args, f"output_dir={tmp_path / 'out'}" if "preset=phase1" not in args else "output_dir=/tmp/x")
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr
    assert not (tmp_path / "out").exists()


def test_data_prep_imports_and_plans_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"      # any `import torch` now raises ImportError
            "import data_prep.run, data_prep.pipeline, data_prep.masking\n"
            "print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_a_vocabulary_trained_on_the_inputs_is_written_hashed_and_used(corpus, tmp_path):
    from data_prep.vocab import parse_vocab, vocab_sha256
    manifest = run(job_args(corpus, tmp_path / "out", "vocab.file=null", "vocab.size=3000", "dupe_factor=1")
                   + IN_PROCESS)
    tokens = parse_vocab((tmp_path / "out" / "vocab.txt").read_text(encoding="utf-8"))
    assert manifest["tokenizer"]["source"] == "trained" and manifest["tokenizer"]["vocab_size"] == len(tokens) <= 3000
    assert manifest["tokenizer"]["vocab_sha256"] == vocab_sha256(tokens)
    ids = np.concatenate(pq.read_table(tmp_path / "out" / manifest["shards"][0]["parquet"]["path"])
                         .column("input_ids").to_numpy(zero_copy_only=False))
    assert ids.max() < len(tokens) and manifest["totals"]["instances"] > 0


@pytest.mark.slow  # ~25 s: tokenizes a 10 MB line and three broken dumps
def test_bad_inputs_are_skipped_and_counted_in_the_manifest_and_beam_metrics(tmp_path, shared_data):
    import bz2
    import shutil
    corpus = tmp_path / "bad"
    (corpus / "books").mkdir(parents=True)
    (corpus / "wiki").mkdir()
    shutil.copy(shared_data / "corpora" / "books" / "chesterton-ball.txt", corpus / "books")  # has a latin-1 byte
    (corpus / "books" / "empty.txt").write_bytes(b"")
    (corpus / "books" / "binary.txt").write_bytes(bytes(range(256)) * 64)
    (corpus / "books" / "crlf.txt").write_bytes(b"One line here.\r\nAnd more text follows.\r\n"
                                                b"\r\nA second paragraph.\r\n")
    (corpus / "books" / "one-sentence.txt").write_text("Only this sentence stands here.\n")
    (corpus / "books" / "long-line.txt").write_text(("word " * 2_000_000) + "\n")  # a 10 MB line
    dump = (shared_data / "corpora" / "wikipedia" /
            "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2").read_bytes()
    (corpus / "wiki" / "truncated.xml.bz2").write_bytes(dump[: len(dump) // 3])
    xml = bz2.decompress(dump)
    (corpus / "wiki" / "broken.xml").write_bytes(xml[: len(xml) // 4])
    corrupt = bytearray(dump)
    corrupt[len(corrupt) // 2: len(corrupt) // 2 + 64] = b"\xff" * 64
    (corpus / "wiki" / "corrupt.xml.bz2").write_bytes(bytes(corrupt))

    manifest = run([f"inputs=[{{path: '{corpus}/books', format: books}}, {{path: '{corpus}/wiki', format: wikipedia}}]",
                    f"output_dir={tmp_path / 'out'}", "preset=phase1", "num_shards=2", "dupe_factor=1"] + IN_PROCESS)
    skipped, counters = manifest["skipped"], manifest["beam_counters"]
    assert skipped["empty_file"] == 1 and skipped["binary_file"] == 1
    assert skipped["corrupt_compression"] == 2 and skipped["malformed_xml"] == 1
    assert manifest["repaired"]["non_utf8_lines_decoded_as_cp1252"] >= 1
    for reason, count in skipped.items():
        assert counters[f"skipped/{reason}"] == count
    assert counters["documents"] == manifest["totals"]["documents"]
    # Every good book survives (latin-1, CRLF, one sentence, the 10 MB line) and the broken dumps keep their
    # complete pages.
    assert manifest["totals"]["documents"] >= 4 + 3
    assert manifest["totals"]["instances"] > 0
