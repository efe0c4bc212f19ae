"""data_prep.readers: format detection and the Wikipedia reader, on the real dump sample and on small dumps made
here (exact counts, corrupt and truncated input)."""
from __future__ import annotations

import bz2
import gzip
import re
import time
from pathlib import Path

import pytest

from data_prep.documents import Document, Skip, SkipReason
from data_prep.readers import FORMATS, detect_format, read_documents
from data_prep.readers.wikipedia import clean_wikitext
from tests.helpers.documents import assert_keys, documents, read, reasons, skips

WIKI_SAMPLE = "wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


@pytest.fixture(scope="module")
def corpora(shared_data) -> Path:
    return shared_data / "corpora"


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
'''Ada Lovelace''' ({{IPA|ˈlʌvlɛs}}) was an English [[mathematician]] and [[writer|author]].\
<ref name="a">{{cite book|title=X}}</ref> \
She worked on [[Charles Babbage]]'s [[Analytical Engine]].<ref>Plain ref.</ref>
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
