"""data_prep.readers: books, the reference's sentence files, JSONL and Parquet, on the real books and on small inputs
made here (exact counts); bad input of every kind is counted, never raised; the streaming helpers chunk-independent."""
from __future__ import annotations

import bz2
import gzip
import json
import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from data_prep.documents import Document, Repair, Skip, SkipReason
from data_prep.readers import FORMATS, _io
from data_prep.readers.books import book_paragraphs, strip_gutenberg
from tests.helpers.documents import assert_keys, documents, read, reasons, skips

BOOKS = ("austen-emma", "austen-persuasion", "austen-sense", "chesterton-ball", "chesterton-brown",
         "chesterton-thursday")


@pytest.fixture(scope="module")
def corpora(shared_data) -> Path:
    return shared_data / "corpora"


# --- books -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def books(corpora: Path) -> dict[str, list[Document | Skip]]:
    return {name: read(corpora / "books" / f"{name}.txt", "books", f"books/{name}.txt") for name in BOOKS}


def test_books_are_one_document_each(books):
    for name, items in books.items():
        (document,) = documents(items)
        assert document.key == f"books/{name}.txt:0" and not document.presplit
        assert len(document.paragraphs) > 900
        for paragraph in document.paragraphs:
            assert paragraph == " ".join(paragraph.split())  # re-joined, white space collapsed
        assert not any(re.fullmatch(r"(CHAPTER|Chapter|VOLUME) [IVXL\d]+", p) for p in document.paragraphs)
        assert not document.paragraphs[0].startswith("[")  # the "[Emma by Jane Austen 1816]" title line


def test_book_paragraphs_are_rejoined(books):
    emma = documents(books["austen-emma"])[0]
    assert emma.paragraphs[0] == (
        "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed to "
        "unite some of the best blessings of existence; and had lived nearly twenty-one years in the world with "
        "very little to distress or vex her.")
    assert emma.paragraphs[-1].endswith("in the perfect happiness of the union.")  # "FINIS" dropped
    persuasion = documents(books["austen-persuasion"])[0]
    assert any('his family, these words, after the date of Mary\'s birth--"Married, December 16, 1810' in p
               for p in persuasion.paragraphs)  # a "--" line end joins without a space


def test_chesterton_ball_footer_stripped_and_latin1_kept(books):
    items = books["chesterton-ball"]
    (document,) = documents(items)
    text = "\n".join(document.paragraphs)
    assert "Gutenberg" not in text and "SMALL PRINT" not in text and "Michael Hart" not in text
    assert document.paragraphs[-1].endswith("fallen haphazard in the pattern of a cross.")
    assert "Brunetière, Coppée, Hauptmann, Barrès, Bourget, Lemaître." in text
    (boilerplate,) = skips(items, Repair.GUTENBERG_BOILERPLATE.value)
    assert boilerplate.detail == "footer (321 lines)" and boilerplate.source == "books/chesterton-ball.txt"
    (repair,) = skips(items, Repair.NON_UTF8_LINES.value)
    assert repair.count == 2


def test_other_books_have_no_boilerplate_or_repairs(books):
    for name in BOOKS:
        if name != "chesterton-ball":
            assert skips(books[name]) == [], name


MODERN = """The Project Gutenberg EBook of Tiny, by A. Writer

This eBook is for the use of anyone anywhere at no cost.

*** START OF THIS PROJECT GUTENBERG EBOOK TINY ***




Produced by Some Volunteer



CHAPTER I

It was a dark
and stormy   night.

The end came soon.

End of the Project Gutenberg EBook of Tiny, by A. Writer

*** END OF THIS PROJECT GUTENBERG EBOOK TINY ***

***** This file should be named 1234.txt *****
"""

OLD = """The Project Gutenberg Etext of Old Tiny
**Welcome To The World of Free Plain Vanilla Electronic Texts**
***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN ETEXTS**START***
Why is this "Small Print!" statement here?  You know: lawyers.
*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*

First paragraph of
the old book.

Second paragraph.
Third line of it.

End of The Project Gutenberg Etext of Old Tiny
"""


def test_gutenberg_markers():
    body, removed = strip_gutenberg(MODERN)
    assert removed == "header (5 lines), footer (5 lines)"
    assert book_paragraphs(body) == ("It was a dark and stormy night.", "The end came soon.")
    body, removed = strip_gutenberg(OLD)
    assert removed == "header (5 lines), footer (1 line)"
    assert book_paragraphs(body) == ("First paragraph of the old book.", "Second paragraph. Third line of it.")
    assert strip_gutenberg("No markers.\n\nAt all.") == ("No markers.\n\nAt all.", "")


def test_book_file_with_boilerplate_and_crlf(tmp_path: Path):
    path = tmp_path / "tiny.txt"
    path.write_bytes(MODERN.replace("\n", "\r\n").encode())
    items = read(path, "books", "b/tiny.txt")
    assert items == [
        Skip(Repair.GUTENBERG_BOILERPLATE.value, "b/tiny.txt", detail="header (5 lines), footer (5 lines)"),
        Document("b/tiny.txt:0", ("It was a dark and stormy night.", "The end came soon.")),
    ]
    path.write_bytes(b"One\rtwo\r\rThree\r")  # old Mac line ends
    assert documents(read(path, "books", "b"))[0].paragraphs == ("One two", "Three")


def test_book_headings_dropped():
    text = ('[Tiny by A. Writer 1900]\n\nVOLUME I\n\nCHAPTER IV\n\nI. The Absence of Mr Glass\n\n"HELP!"\n\n'
            "Chapter 2\n\n***\n\nShe said no.\n\nTHE END\n")
    assert book_paragraphs(text) == ('"HELP!"', "She said no.")


def test_book_empty_binary_missing_and_gzip(tmp_path: Path):
    path = tmp_path / "x.txt"
    path.write_bytes(b"")
    assert read(path, "books", "x") == [Skip(SkipReason.EMPTY_FILE.value, "x")]
    path.write_bytes(b" \r\n\t\n")
    assert read(path, "books", "x") == [Skip(SkipReason.EMPTY_FILE.value, "x")]
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 8)
    assert read(path, "books", "x") == [Skip(SkipReason.BINARY_FILE.value, "x",
                                             detail="NUL or control bytes at the start")]
    assert reasons(read(tmp_path / "missing.txt", "books", "x")) == {"unreadable_file": 1}
    path = tmp_path / "x.txt.gz"
    path.write_bytes(gzip.compress(b"A gzipped\nbook.\n\nTwo."))
    assert documents(read(path, "books", "x")) == [Document("x:0", ("A gzipped book.", "Two."))]


def test_book_with_ten_megabyte_line(tmp_path: Path):
    # Over the default max_line_chars (tests/data_prep/test_long_lines.py): raised here, to read it in linear time.
    path = tmp_path / "long.txt"
    path.write_bytes(b"Intro.\n\n" + b"word " * 2_000_000 + b"caf\xe9\n")
    start = time.perf_counter()
    items = read(path, "books", "long", max_line_chars=20_000_000)
    assert time.perf_counter() - start < 10
    (document,) = documents(items)
    assert document.paragraphs[0] == "Intro."
    assert len(document.paragraphs[1]) == 10_000_004 and document.paragraphs[1].endswith("word café")
    assert skips(items) == [Skip(Repair.NON_UTF8_LINES.value, "long", count=1)]


# --- sentences ---------------------------------------------------------------------------------------------

def test_sentences_documents_split_on_blank_lines(tmp_path: Path):
    path = tmp_path / "s.txt"
    path.write_bytes(b"\xef\xbb\xbfFirst doc, one.\r\n  First doc, two.  \n\n\n\nSecond doc.\n \t\n"
                     b"Third doc \xe9.\nThird, last line without newline")
    items = read(path, "sentences", "s.txt")
    assert items == [
        Document("s.txt:0", ("First doc, one.", "First doc, two."), presplit=True),
        Document("s.txt:1", ("Second doc.",), presplit=True),
        Document("s.txt:2", ("Third doc é.", "Third, last line without newline"), presplit=True),
        Skip(Repair.NON_UTF8_LINES.value, "s.txt", count=1),
    ]


def test_sentences_empty_binary_and_compressed(tmp_path: Path):
    path = tmp_path / "s.txt"
    path.write_bytes(b"\n\n  \n")
    assert read(path, "sentences", "s") == [Skip(SkipReason.EMPTY_FILE.value, "s")]
    path.write_bytes(b"\x00\x01\x02binary")
    assert reasons(read(path, "sentences", "s")) == {"binary_file": 1}
    path.write_bytes(b"a.\rb.\r\rc.\r")  # old Mac line ends
    assert [d.paragraphs for d in documents(read(path, "sentences", "s"))] == [("a.", "b."), ("c.",)]
    path = tmp_path / "s.txt.bz2"
    path.write_bytes(bz2.compress(b"a.\nb.\n\nc.\n\n" * 1000))
    assert len(documents(read(path, "sentences", "s"))) == 2000


def test_sentences_ten_megabyte_line(tmp_path: Path):
    path = tmp_path / "s.txt"
    path.write_bytes(b"short.\n" + b"x" * 10_000_000 + b"\n\nnext.\n")
    start = time.perf_counter()
    items = read(path, "sentences", "s", max_line_chars=20_000_000)   # over the default, as above
    assert time.perf_counter() - start < 10
    assert [len(p) for d in documents(items) for p in d.paragraphs] == [6, 10_000_000, 5]


# --- jsonl -------------------------------------------------------------------------------------------------

def test_jsonl_bad_line_and_missing_column(tmp_path: Path):
    lines = [
        json.dumps({"text": "Para one\nwrapped.\n\n\nPara two.", "id": 1}),
        "{not json",
        "",
        json.dumps({"body": "no text column"}),
        json.dumps({"text": 42}),
        json.dumps(["a", "list"]),
        json.dumps({"text": "  \n "}),
        json.dumps({"text": "Last \ud800 record."}),
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    items = read(path, "jsonl", "d.jsonl")
    assert documents(items) == [Document("d.jsonl:0", ("Para one wrapped.", "Para two.")),
                                Document("d.jsonl:1", ("Last \ufffd record.",))]
    assert reasons(items) == {"malformed_record": 4, "empty_document": 1}
    assert [s.detail.split(":")[0] for s in skips(items)] == ["line 2", "line 4", "line 5", "line 6", "line 7"]
    assert "missing" in skips(items)[1].detail


def test_jsonl_text_column_compression_and_empty(tmp_path: Path):
    path = tmp_path / "d.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(json.dumps({"content": f"Record {i}."}).encode() + b"\r\n"
                                            for i in range(100))))
    items = read(path, "jsonl", "d", text_column="content")
    assert len(documents(items)) == 100 and skips(items) == []
    assert read(path, "jsonl", "d") == [Skip(SkipReason.MALFORMED_RECORD.value, "d", detail=f"line {i}: column "
                                             f"'text' is missing") for i in range(1, 101)]
    path = tmp_path / "e.jsonl"
    path.write_bytes(b"")
    assert read(path, "jsonl", "e") == [Skip(SkipReason.EMPTY_FILE.value, "e")]


def test_jsonl_ten_megabyte_record(tmp_path: Path):
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"text": "word " * 2_000_000}) + "\n")
    (document,) = documents(read(path, "jsonl", "big", max_line_chars=20_000_000))   # over the default, as above
    assert len(document.paragraphs[0]) == 9_999_999


# --- parquet -----------------------------------------------------------------------------------------------

def test_parquet_with_column(tmp_path: Path):
    path = tmp_path / "d.parquet"
    texts = [f"Row {i} first.\n\nRow {i} second." for i in range(1200)]
    texts[5] = None
    texts[700] = "   "
    pq.write_table(pa.table({"id": list(range(1200)), "text": texts}), path, row_group_size=500)
    items = read(path, "parquet", "d.parquet")
    assert len(documents(items)) == 1198
    assert documents(items)[0] == Document("d.parquet:0", ("Row 0 first.", "Row 0 second."))
    assert documents(items)[5].paragraphs == ("Row 6 first.", "Row 6 second.")
    assert_keys(items, "d.parquet")
    assert reasons(items) == {"malformed_record": 1, "empty_document": 1}


def test_parquet_without_or_with_wrong_column(tmp_path: Path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"body": ["a", "b", "c"]}), path)
    (skip,) = read(path, "parquet", "d")
    assert skip.reason == SkipReason.MALFORMED_RECORD.value and skip.count == 3 and "body" in skip.detail
    assert len(documents(read(path, "parquet", "d", text_column="body"))) == 3
    pq.write_table(pa.table({"text": [1, 2]}), path)
    assert read(path, "parquet", "d")[0].count == 2
    pq.write_table(pa.table({"text": pa.array([b"caf\xe9", b"plain"], pa.binary())}), path)
    items = read(path, "parquet", "d")
    assert [d.paragraphs for d in documents(items)] == [("café",), ("plain",)]
    assert skips(items) == [Skip(Repair.NON_UTF8_LINES.value, "d", count=1)]


def test_parquet_empty_garbage_missing(tmp_path: Path):
    path = tmp_path / "d.parquet"
    path.write_bytes(b"")
    assert reasons(read(path, "parquet", "d")) == {"empty_file": 1}
    path.write_bytes(b"not a parquet file at all")
    assert reasons(read(path, "parquet", "d")) == {"unreadable_file": 1}
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
    assert reasons(read(path, "parquet", "d")) == {"empty_file": 1}
    assert reasons(read(tmp_path / "missing.parquet", "parquet", "d")) == {"unreadable_file": 1}


# --- bad input never raises --------------------------------------------------------------------------------

NASTY = [
    b"",
    b"\xff\xfe\x00\x00",
    b"BZh91AY&SY" + bytes(range(256)),  # a bz2 header, then garbage
    b"\x1f\x8b\x08\x00" + b"\x00" * 40,  # a gzip header, then garbage
    b"PAR1" + b"\x00" * 20 + b"PAR1",
    b"<mediawiki><page><title>A</title><ns>0</ns><revision><text>{{{{[[<ref>''' unclosed",
    b'<!DOCTYPE x [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
    b'<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">'
    b'<!ENTITY e "&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;"><!ENTITY f "&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;">'
    b'<!ENTITY g "&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;"><!ENTITY h "&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;">]>'
    b"<mediawiki><page><title>A</title><ns>0</ns><revision><text>&h;</text></revision></page></mediawiki>",
    b'{"text": "\\ud800"}\n[[[[[[\n' + b"[" * 100_000 + b"\n",
    bz2.compress(b"x" * 1000)[:-5],
    gzip.compress(b"y" * 1000)[:-5],
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("raw", NASTY, ids=range(len(NASTY)))
def test_bad_input_never_raises(tmp_path: Path, fmt: str, raw: bytes):
    for name in ("input.bin", "input.bz2", "input.gz"):
        path = tmp_path / name
        path.write_bytes(raw)
        items = read(path, fmt, "n")
        assert all(isinstance(item, (Document, Skip)) for item in items)
        assert all(item.source == "n" for item in skips(items))


# --- streaming helpers: any chunking gives the same result -------------------------------------------------

def _chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in zip(points, points[1:])]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=6), st.lists(st.integers(0, 10_000), max_size=8),
       st.sampled_from(["bz2", "gzip"]))
def test_decompress_multistream_any_chunking(parts: list[bytes], cuts: list[int], kind: str):
    compress = bz2.compress if kind == "bz2" else gzip.compress
    data = b"".join(compress(part) for part in parts)
    assert b"".join(_io._decompress(_chunked(data, cuts), kind)) == b"".join(parts)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200).map(lambda b: b.replace(b"\x00", b"\r\n")), st.lists(st.integers(0, 200), max_size=8))
# A lone CR after the last LF is an (old Mac) line end of an empty line, as in str.splitlines: one line b"".
@example(data=b"\r", cuts=[])
@example(data=b"a\n\r", cuts=[2])
@example(data=b"a\r\n", cuts=[2])   # CR and LF in different chunks
@example(data=b"\n", cuts=[])
def test_iter_lines_any_chunking(data: bytes, cuts: list[int]):
    pieces = data.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()  # no line after a final newline (only an empty piece: b"\r" there is a line of its own)
    expected = [line[:-1] if line.endswith(b"\r") else line for line in pieces]
    assert list(_io.iter_lines(_chunked(data, cuts))) == expected
