"""Tests for data_prep.readers on the real shared corpora and on small inputs made here (exact counts)."""
from __future__ import annotations

import bz2
import collections
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
from data_prep.readers import FORMATS, _io, detect_format, read_documents
from data_prep.readers.books import book_paragraphs, strip_gutenberg
from data_prep.readers.wikipedia import clean_wikitext

REPO_ROOT = Path(__file__).resolve().parents[2]
WIKI_SAMPLE = "wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
BOOKS = ("austen-emma", "austen-persuasion", "austen-sense", "chesterton-ball", "chesterton-brown",
         "chesterton-thursday")


@pytest.fixture(scope="module")
def corpora(shared_data) -> Path:
    return shared_data / "corpora"


def read(path: Path | str, fmt: str, source: str = "src", **kwargs) -> list[Document | Skip]:
    return list(read_documents(str(path), fmt, source, **kwargs))


def documents(items) -> list[Document]:
    return [item for item in items if isinstance(item, Document)]


def skips(items, reason: str | None = None) -> list[Skip]:
    return [item for item in items if isinstance(item, Skip) and (reason is None or item.reason == reason)]


def reasons(items) -> collections.Counter:
    return collections.Counter(item.reason for item in items if isinstance(item, Skip))


def assert_keys(items, source: str) -> None:
    assert [d.key for d in documents(items)] == [f"{source}:{i}" for i in range(len(documents(items)))]


# --- detect_format -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("path", "fmt"),
    [
        ("wiki/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2", "wikipedia"),
        ("dump.xml", "wikipedia"),
        ("gs://bucket/dump.XML.bz2", "wikipedia"),
        ("dump.xml.gz", "wikipedia"),
        ("data.jsonl", "jsonl"),
        ("data.json", "jsonl"),
        ("data.json.gz", "jsonl"),
        ("data.jsonl.bz2", "jsonl"),
        ("part-0001.parquet", "parquet"),
        ("books/austen-emma.txt", "books"),
        ("books/README", "books"),
        ("books/emma.txt.gz", "books"),
        ("sentences.txt", "books"),  # 'sentences' must be named
    ],
)
def test_detect_format(path: str, fmt: str):
    assert detect_format(path) == fmt
    assert fmt in FORMATS


def test_unknown_format_is_a_programming_error(tmp_path: Path):
    with pytest.raises(ValueError):
        read_documents(str(tmp_path / "x"), "csv", "x")


# --- wikipedia: the real dump sample -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def wiki_items(corpora: Path) -> list[Document | Skip]:
    return read(corpora / WIKI_SAMPLE, "wikipedia", "wikipedia/sample.bz2")


def test_wikipedia_sample_counts(wiki_items):
    counts = reasons(wiki_items)
    articles = len(documents(wiki_items))
    assert articles == 105
    assert counts == {SkipReason.REDIRECT.value: 99, SkipReason.NON_ARTICLE_NAMESPACE.value: 1,
                      SkipReason.EMPTY_DOCUMENT.value: 1}
    assert articles + sum(counts.values()) == 206  # every page is accounted for
    assert_keys(wiki_items, "wikipedia/sample.bz2")
    assert all(not d.presplit for d in documents(wiki_items))
    assert skips(wiki_items, SkipReason.NON_ARTICLE_NAMESPACE.value)[0].detail.startswith("Wikipedia:")
    assert all(s.source == "wikipedia/sample.bz2" for s in skips(wiki_items))


def test_wikipedia_sample_text_is_clean(wiki_items):
    paragraphs = [p for d in documents(wiki_items) for p in d.paragraphs]
    text = "\n".join(paragraphs)
    for markup in ("{{", "}}", "[[", "]]", "<ref", "</ref", "{|", "|}", "Category:", "File:", "Image:", "thumb|",
                   "&nbsp;", "&amp;", "__TOC__", "'''", "<!--", "\x00"):
        assert markup not in text, markup
    assert not re.search(r"^=+.*=+$", text, re.MULTILINE)
    assert all(p and p == " ".join(p.split()) for p in paragraphs)  # white space normalised
    assert len(paragraphs) > 4000 and len(text) > 2_000_000
    first = documents(wiki_items)[0]  # Anarchism
    assert first.paragraphs[0].startswith("Anarchism is a political philosophy")


# --- wikipedia: inputs made here ---------------------------------------------------------------------------

_EXPORT_NS = "http://www.mediawiki.org/xml/export-0.10/"


def page(title: str, text: str, ns: int | None = 0, redirect: str | None = None) -> str:
    ns_xml = "" if ns is None else f"<ns>{ns}</ns>"
    redirect_xml = f'<redirect title="{redirect}" />' if redirect else ""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return (f"<page><title>{title}</title>{ns_xml}<id>1</id>{redirect_xml}<revision><id>2</id>"
            f'<text xml:space="preserve">{text}</text></revision></page>\n')


def export(*pages: str, namespace: str = _EXPORT_NS) -> str:
    return (f'<mediawiki xmlns="{namespace}" version="0.10" xml:lang="en"><siteinfo><sitename>W</sitename>'
            '<namespaces><namespace key="0" /><namespace key="1">Talk</namespace>'
            '<namespace key="10">Template</namespace></namespaces></siteinfo>\n' + "".join(pages) + "</mediawiki>\n")


ARTICLE = """{{Infobox person|name=Ada|birth_date={{birth date|1815|12|10}}}}
'''Ada Lovelace''' ({{IPA|ˈlʌvlɛs}}) was an English [[mathematician]] and [[writer|author]].<ref name="a">{{cite book|title=X}}</ref> She worked on [[Charles Babbage]]'s [[Analytical Engine]].<ref>Plain ref.</ref>
[[File:Ada Lovelace portrait.jpg|thumb|left|Portrait of [[Ada Lovelace|Ada]] in 1840]]

== Early life ==
Her father was [[Lord Byron]]&nbsp;&ndash; the poet.<!-- hidden comment --> She was raised by her mother.

{| class="wikitable"
! Year !! Event
|-
| 1815 || Born in London today
|}
* [[Analytical Engine]]
* She published the first algorithm intended for a machine in 1843.
<math>E = mc^2</math>
<gallery>
File:Other.jpg|A caption that is long enough
</gallery>

=== See also ===
* [[Charles Babbage]]

[[Category:1815 births]]
[[Category:English mathematicians]]
[[de:Ada Lovelace]]
[[fr:Ada Lovelace]]
__NOTOC__
"""


def test_clean_wikitext_exact():
    assert clean_wikitext(ARTICLE) == (
        "Ada Lovelace was an English mathematician and author. She worked on Charles Babbage's Analytical Engine.",
        "Her father was Lord Byron – the poet. She was raised by her mother.",
        "She published the first algorithm intended for a machine in 1843.",
    )


def test_clean_wikitext_debris_rule():
    assert clean_wikitext("* Item\n# Another short item\n: indented\nNotes\n1 2\n----\n|}") == ()
    # ordinary lines of a paragraph are joined, a blank line ends the paragraph
    assert clean_wikitext("One two three four\nfive six.\n\nShort one.") == ("One two three four five six.",
                                                                           "Short one.")
    # markup the parser gave up on (an unbalanced '' in a <ref>) does not leak
    assert clean_wikitext("Text here is fine.<ref>[[A|B]]'' by [[C]]. p. 1</ref> More text follows here.") == (
        "Text here is fine. More text follows here.",)


def test_clean_wikitext_pathological_pages_are_fast():
    start = time.perf_counter()
    assert clean_wikitext("<ref>" * 50_000) == ()
    assert clean_wikitext("<div>" * 50_000 + "Words that make a sentence.") == ("Words that make a sentence.",)
    assert clean_wikitext("[http://x.org/a " * 20_000) != ()  # kept as text, but in time
    assert clean_wikitext("Some text here. <!-- open comment " + "<!--" * 50_000) == ("Some text here.",)
    long_article = "Text with a sentence here. " + "<b>bold words</b> and [http://example.org a link]. " * 6000
    assert clean_wikitext(long_article)[0].startswith("Text with a sentence here. bold words and a link. bold")
    assert time.perf_counter() - start < 8


def test_wikipedia_exact_counts_and_namespace_independence(tmp_path: Path):
    xml = export(
        page("Ada", ARTICLE),
        page("Lovelace", "#REDIRECT [[Ada]]", redirect="Ada"),
        page("Old redirect", "#redirect [[Ada]]"),  # no <redirect/> element: the text says it
        page("Talk:Ada", "Some discussion that is long enough to keep.", ns=1),
        page("Template only", "{{Infobox}}\n[[Category:X]]"),
        page("Bob", "Bob is a name that is given to people."),
    )
    for namespace in (_EXPORT_NS, "http://www.mediawiki.org/xml/export-0.3/", ""):
        path = tmp_path / "dump.xml"
        path.write_text(xml if namespace == _EXPORT_NS else xml.replace(f'xmlns="{_EXPORT_NS}"',
                                                                          f'xmlns="{namespace}"' if namespace else ""))
        items = read(path, "wikipedia", "w/dump.xml")
        assert reasons(items) == {"redirect": 2, "non_article_namespace": 1, "empty_document": 1}
        assert [d.key for d in documents(items)] == ["w/dump.xml:0", "w/dump.xml:1"]
        assert documents(items)[1].paragraphs == ("Bob is a name that is given to people.",)
        assert skips(items, "empty_document")[0].detail == "Template only"


def test_wikipedia_schema_without_ns_element_uses_siteinfo_namespaces(tmp_path: Path):
    xml = export(page("Talk:Ada", "A talk page with enough words in it.", ns=None),
                 page("Ada", "Ada was a mathematician of note.", ns=None))
    path = tmp_path / "old.xml"
    path.write_text(xml)
    items = read(path, "wikipedia", "old")
    assert reasons(items) == {"non_article_namespace": 1}
    assert documents(items) == [Document("old:0", ("Ada was a mathematician of note.",))]


def _small_dump(n: int) -> str:
    return export(*(page(f"P{i}", f"Page number {i} has a sentence of text.") for i in range(n)))


def test_wikipedia_multistream_bz2(tmp_path: Path):
    xml = _small_dump(30).encode()
    cut = xml.index(b"<page><title>P10<")  # streams split mid-file, as in the multistream dumps
    path = tmp_path / "multi.xml.bz2"
    path.write_bytes(bz2.compress(xml[:cut]) + bz2.compress(xml[cut:cut + 7]) + bz2.compress(xml[cut + 7:]))
    items = read(path, "wikipedia", "m")
    assert skips(items) == []
    assert len(documents(items)) == 30
    assert documents(items)[29].paragraphs == ("Page number 29 has a sentence of text.",)


def test_wikipedia_plain_xml_equals_bz2(tmp_path: Path, corpora: Path, wiki_items):
    xml = bz2.decompress((corpora / WIKI_SAMPLE).read_bytes())
    cut = xml.index(b"<page>", len(xml) // 5)
    path = tmp_path / "part.xml"
    path.write_bytes(xml[:cut] + b"</mediawiki>\n")
    items = read(path, "wikipedia", "wikipedia/sample.bz2")
    assert skips(items, SkipReason.MALFORMED_XML.value) == []
    assert 0 < len(items) < len(wiki_items)
    assert items == wiki_items[:len(items)]


def test_wikipedia_gzip(tmp_path: Path):
    path = tmp_path / "dump.xml.gz"
    path.write_bytes(gzip.compress(_small_dump(3).encode()) + gzip.compress(b""))
    assert len(documents(read(path, "wikipedia", "g"))) == 3


def _flip(data: bytes, at: int, n: int = 64) -> bytes:
    return data[:at] + bytes(b ^ 0xFF for b in data[at:at + n]) + data[at + n:]


def test_wikipedia_corrupt_bz2_keeps_earlier_pages(tmp_path: Path, corpora: Path, wiki_items):
    data = (corpora / WIKI_SAMPLE).read_bytes()
    path = tmp_path / "corrupt.bz2"
    path.write_bytes(_flip(data, len(data) * 3 // 4))
    items = read(path, "wikipedia", "wikipedia/sample.bz2")
    assert reasons(items)[SkipReason.CORRUPT_COMPRESSION.value] == 1
    assert items[-1].reason == SkipReason.CORRUPT_COMPRESSION.value
    kept = items[:-1]
    assert len(documents(kept)) >= 10
    assert kept == wiki_items[:len(kept)]  # no garbage from the damaged block


def test_wikipedia_truncated_bz2_keeps_earlier_pages(tmp_path: Path, corpora: Path, wiki_items):
    data = (corpora / WIKI_SAMPLE).read_bytes()
    path = tmp_path / "truncated.bz2"
    path.write_bytes(data[: len(data) * 6 // 10])
    items = read(path, "wikipedia", "wikipedia/sample.bz2")
    assert reasons(items)[SkipReason.CORRUPT_COMPRESSION.value] == 1
    assert items[-1].reason == SkipReason.CORRUPT_COMPRESSION.value
    assert "truncated" in items[-1].detail
    kept = items[:-1]
    assert len(documents(kept)) >= 30
    assert kept == wiki_items[:len(kept)]


def test_wikipedia_truncated_small_bz2_and_garbage_bz2(tmp_path: Path):
    data = bz2.compress(_small_dump(5).encode())
    path = tmp_path / "t.xml.bz2"
    path.write_bytes(data[:-20])
    assert reasons(read(path, "wikipedia", "t")) == {"corrupt_compression": 1}
    path.write_bytes(b"this is not bz2 at all")
    assert reasons(read(path, "wikipedia", "t")) == {"corrupt_compression": 1}


def test_wikipedia_truncated_xml_keeps_earlier_pages(tmp_path: Path):
    xml = _small_dump(10)
    path = tmp_path / "t.xml"
    path.write_text(xml[: xml.index("<page><title>P7<") + 40])
    items = read(path, "wikipedia", "t")
    assert len(documents(items)) == 7
    assert reasons(items) == {"malformed_xml": 1}
    assert items[-1].reason == "malformed_xml" and "after 7 pages" in items[-1].detail


def test_wikipedia_broken_xml_and_empty_and_missing(tmp_path: Path):
    path = tmp_path / "b.xml"
    path.write_text(_small_dump(4).replace("<title>P2</title>", "<title>P2</titel>"))
    items = read(path, "wikipedia", "b")
    assert len(documents(items)) == 2 and reasons(items) == {"malformed_xml": 1}
    path.write_bytes(b"  \n")
    assert reasons(read(path, "wikipedia", "b")) == {"empty_file": 1}
    path.write_bytes(b"")
    assert reasons(read(path, "wikipedia", "b")) == {"empty_file": 1}
    assert reasons(read(tmp_path / "missing.xml", "wikipedia", "b")) == {"unreadable_file": 1}


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
    assert read(path, "books", "x") == [Skip(SkipReason.BINARY_FILE.value, "x")]
    assert reasons(read(tmp_path / "missing.txt", "books", "x")) == {"unreadable_file": 1}
    path = tmp_path / "x.txt.gz"
    path.write_bytes(gzip.compress(b"A gzipped\nbook.\n\nTwo."))
    assert documents(read(path, "books", "x")) == [Document("x:0", ("A gzipped book.", "Two."))]


def test_book_with_ten_megabyte_line(tmp_path: Path):
    path = tmp_path / "long.txt"
    path.write_bytes(b"Intro.\n\n" + b"word " * 2_000_000 + b"caf\xe9\n")
    start = time.perf_counter()
    items = read(path, "books", "long")
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
    items = read(path, "sentences", "s")
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
    (document,) = documents(read(path, "jsonl", "big"))
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
    pq.write_table(pa.table({"text": pa.array([b"caf\xe9", "plain".encode()], pa.binary())}), path)
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
