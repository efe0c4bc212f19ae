"""A line too long to be text (max_line_chars) is skipped, counted and its file named, by every reader of lines and by
the tokenizing step; the real command keeps its memory on a 200 MB line and makes the other files' instances."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep.documents import SkipReason
from data_prep.readers import _io
from data_prep.run import run
from tests.helpers.documents import documents, read, skips

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLE_BOOK = REPO_ROOT / "data_prep" / "sample_corpus" / "books" / "austen-persuasion.txt"
IN_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
BOUND = 1000
LONG = " ".join(["blob"] * 400)   # 1,999 characters on one line, no sentence end


def _chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in zip(points, points[1:])]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([b"", b"ab", b"abcdefgh", b"\r", b"x" * 30]), max_size=8).map(b"\n".join),
       st.lists(st.integers(0, 200), max_size=8), st.integers(1, 12))
def test_iter_lines_lets_go_of_lines_over_the_bound_at_any_chunking(data: bytes, cuts: list[int], bound: int):
    pieces = data.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()
    expected = [(len(p), None) if len(p) > bound else (None, p[:-1] if p.endswith(b"\r") else p) for p in pieces]
    got = [(line.size, None) if isinstance(line, _io.LongLine) else (None, line)
           for line in _io.iter_lines(_chunked(data, cuts), max_bytes=bound)]
    assert got == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"bc", b"\r", b"\n", b"\r\n"]), max_size=12).map(b"".join),
       st.lists(st.integers(0, 30), max_size=6))
def test_every_line_end_is_one_lf_at_any_chunking(data: bytes, cuts: list[int]):
    assert b"".join(_io.lf_line_ends(_chunked(data, cuts))) == data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def _write(path: Path, fmt: str) -> Path:
    """A small file of `fmt` with one LONG line among short text."""
    if fmt == "books":
        path.write_text(f"First paragraph here.\n\n{LONG}\n\nLast paragraph here.\n")
    elif fmt == "sentences":
        path.write_text(f"One.\nTwo.\n{LONG}\nThree.\n\nNext document.\n")
    elif fmt == "wikiextractor":
        path.write_text('<doc id="1" url="u" title="T">\nT\n\nA line of prose that is kept in the article.\n'
                        f"{LONG}\nAnother line of prose that is kept as well.\n</doc>\n")
    elif fmt == "jsonl":
        path.write_text("\n".join(json.dumps({"text": text}) for text in ("Record one.", LONG, "Record three.")) + "\n")
    else:
        pq.write_table(pa.table({"text": [f"Short first.\n{LONG}\nShort last.", "Second row."]}), path)
    return path


KEPT = {
    "books": [("First paragraph here.", "Last paragraph here.")],
    "sentences": [("One.", "Two.", "Three."), ("Next document.",)],
    "wikiextractor": [("A line of prose that is kept in the article.", "Another line of prose that is kept as well.")],
    "jsonl": [("Record one.",), ("Record three.",)],
    "parquet": [("Short first.", "Short last."), ("Second row.",)],
}
WHERE = {"books": "line 3", "sentences": "line 3", "wikiextractor": "line 5", "jsonl": "line 2", "parquet": "rows 0-1"}


@pytest.mark.parametrize("fmt", sorted(KEPT))
def test_each_line_reader_skips_a_long_line_counts_it_and_keeps_the_rest(tmp_path: Path, fmt: str):
    items = read(_write(tmp_path / f"input.{fmt}", fmt), fmt, "input", max_line_chars=BOUND)
    assert [d.paragraphs for d in documents(items)] == KEPT[fmt]
    (skip,) = skips(items, SkipReason.LINE_TOO_LONG.value)
    assert skip.source == "input" and skip.count == 1
    assert skip.detail.startswith(WHERE[fmt]) and f"max_line_chars={BOUND:,}" in skip.detail
    line = json.dumps({"text": LONG}) if fmt == "jsonl" else LONG   # a JSONL line is the whole record
    assert skip.detail.endswith(f"the longest {len(line):,} {'characters' if fmt == 'parquet' else 'bytes'}")


def test_the_bound_counts_characters_not_bytes(tmp_path: Path):
    path = tmp_path / "s.txt"
    path.write_text("é" * BOUND + "\n" + "é" * (BOUND + 1) + "\n", encoding="utf-8")   # 2 bytes a character
    items = read(path, "sentences", "s", max_line_chars=BOUND)
    assert [len(p) for d in documents(items) for p in d.paragraphs] == [BOUND]
    assert [s.count for s in skips(items, SkipReason.LINE_TOO_LONG.value)] == [1]


def test_job_skips_long_lines_and_sentences_and_names_their_files(tmp_path: Path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "story.txt").write_text(SAMPLE_BOOK.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    (corpus / "blob.txt").write_text(f"Some text before it.\n\n{LONG}\n", encoding="utf-8")
    # Short lines joined into one paragraph with no sentence end: one sentence of 2,699 characters.
    (corpus / "unbroken.txt").write_text("\n".join(["word after word after word"] * 100) + "\n", encoding="utf-8")
    manifest = run([f"inputs=[{corpus}]", f"output_dir={tmp_path / 'out'}", "preset=phase1", "num_shards=1",
                    "dupe_factor=1", f"+max_line_chars={BOUND}", *IN_PROCESS])
    assert manifest["parameters"]["max_line_chars"] == BOUND
    assert manifest["skipped"] == {"line_too_long": 1, "no_tokens": 1, "sentence_too_long": 1}
    where = manifest["skipped_where"]
    assert [e["file"] for e in where["line_too_long"]["listed"]] == ["blob.txt"]
    assert where["line_too_long"]["listed"][0]["detail"].startswith("line 3 longer than max_line_chars=1,000")
    assert [e["file"] for e in where["sentence_too_long"]["listed"]] == ["unbroken.txt"]
    assert manifest["totals"]["documents"] == 2 and manifest["totals"]["instances"] > 0   # story.txt and blob.txt


def _corpus_with_a_200_mb_line(root: Path) -> Path:
    """A sample book beside one file whose second line is 200 MB of words (no line break, no sentence end)."""
    corpus = root / "corpus"
    corpus.mkdir()
    text = SAMPLE_BOOK.read_text(encoding="utf-8")
    (corpus / "persuasion.txt").write_text(text, encoding="utf-8")
    words = (" ".join(re.findall(r"[a-z]+", text.lower())) + " ").encode()
    with open(corpus / "dump.txt", "wb") as out:
        out.write(b"A first line of text.\n")
        for _ in range(200 * 2**20 // len(words) + 1):
            out.write(words)
        out.write(b"\n")
    return corpus


# Runs the command given and reports on stderr the peak resident memory of its largest process (Beam's workers
# included), in KiB: resource counts the children it waited for.
PEAK_RSS = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
            "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
            "sys.exit(code)")


def test_a_200_mb_line_is_skipped_named_and_held_by_no_process(tmp_path: Path):
    corpus, out = _corpus_with_a_200_mb_line(tmp_path), tmp_path / "shards"
    command = [sys.executable, "data_prep/run.py", "preset=phase1", f"inputs=[{corpus}]", f"output_dir={out}"]
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", PEAK_RSS, *command], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=600, env={**os.environ, "RAYON_NUM_THREADS": "1"})
    seconds = time.perf_counter() - started
    peak_mib = int(re.search(r"peak_rss_kib (\d+)", result.stderr).group(1)) / 1024
    print(f"200 MB line: exit {result.returncode} in {seconds:.1f} s, peak RSS {peak_mib:.0f} MiB")
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"line_too_long in 1 file: dump\.txt \(line 2 longer than max_line_chars=1,000,000",
                     result.stdout), result.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["skipped"] == {"line_too_long": 1}
    assert manifest["skipped_where"]["line_too_long"]["listed"][0]["file"] == "dump.txt"
    assert manifest["totals"]["documents"] == 2 and manifest["totals"]["instances"] > 0
    assert peak_mib < 1024   # the line is never held: an old run reached 6 GB before tokenizers aborted
