"""NSP negatives whatever the input: one book, one large record, a handful of files (item: one-document corpora).

The reference gives about half random pairs on any of these; a job whose buckets hold one document must too
(B then comes from far away in the same document, counted), and must warn when the share is off.
"""
import json

import pytest

from data_prep.run import format_summary, run

IN_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]


def prepare(inputs: str, out, *extra) -> dict:
    return run([f"inputs={inputs}", f"output_dir={out}", "preset=phase1", "dupe_factor=2", *extra, *IN_PROCESS])


def check_share(manifest: dict) -> None:
    totals, stats = manifest["totals"], manifest["statistics"]
    assert stats["random_next_share"] > 0.45, stats
    assert abs(stats["random_next_share"] - stats["expected_random_next_share"]) < 0.05
    assert manifest["warnings"] == []
    summary = format_summary(manifest)
    assert "B from A's document" in summary and "no random B found" in summary and "WARNING" not in summary
    return totals


@pytest.fixture(scope="module")
def books(shared_data):
    return shared_data / "corpora" / "books"


def test_one_book_alone(books, tmp_path):
    totals = check_share(prepare(f"[{{path: '{books}/austen-persuasion.txt', format: books}}]", tmp_path))
    assert totals["random_next_from_same_document"] > 0.4 * totals["instances"]


def test_one_large_jsonl_record(books, tmp_path):
    record = tmp_path / "one.jsonl"
    record.write_text(json.dumps({"text": (books / "chesterton-thursday.txt").read_text(encoding="utf-8")}) + "\n")
    totals = check_share(prepare(f"['{record}']", tmp_path / "out"))
    assert totals["documents"] == 1 and totals["random_next_from_same_document"] > 0


def test_a_handful_of_files_in_more_buckets_than_documents(books, tmp_path):
    """Four books over four buckets: some buckets hold one book, some none, one perhaps two."""
    manifest = prepare(f"[{{path: '{books}/chesterton-*.txt', format: books}}, "
                       f"{{path: '{books}/austen-persuasion.txt', format: books}}]", tmp_path, "num_shards=4")
    totals = check_share(manifest)
    assert totals["documents"] == 4 and totals["random_next_from_same_document"] > 0


def test_a_document_too_short_for_a_distant_b_is_counted_and_warned(tmp_path):
    record = tmp_path / "short.jsonl"
    record.write_text(json.dumps({"text": " ".join(f"Sentence number {i} is short." for i in range(30))}) + "\n")
    manifest = prepare(f"['{record}']", tmp_path / "out", "dupe_factor=40")   # enough instances to judge a share
    assert manifest["statistics"]["random_next_share"] < 0.1   # short targets may still find a distant B
    assert manifest["totals"]["chunks_without_random_document"] > 0
    assert len(manifest["warnings"]) == 1
    assert "WARNING: random-next share" in format_summary(manifest)
