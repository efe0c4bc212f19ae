"""data_prep.readers.wikiextractor: WikiExtractor's <doc> blocks, on a slice of the real extracted Wikipedia (every
article read once, a truncated bz2 keeps the articles before the damage) and on small files written here; the format
recognised by content, whatever the file's name."""
from __future__ import annotations

import bz2
import re
import shutil
from pathlib import Path

import pytest

from data_prep.documents import SkipReason
from data_prep.readers import detect_format
from data_prep.readers.wikiextractor import is_disambiguation
from tests.helpers.documents import assert_keys, documents, read, reasons, skips

SLICE = ("wiki_00.bz2", "wiki_37.bz2", "wiki_95.bz2")   # a few of the 100 files: CI reads the rest in the benchmark
_DOC_OPEN = re.compile(rb'^<doc id="(\d+)" url="[^"]*" title="([^"]*)">$', re.MULTILINE)


@pytest.fixture(scope="module")
def extracted(shared_data) -> Path:
    return shared_data / "corpora" / "wikipedia_extracted" / "AA"


def doc(title: str, *lines: str, page_id: int = 1) -> str:
    return f'<doc id="{page_id}" url="https://en.wikipedia.org/wiki?curid={page_id}" title="{title}">\n' + \
        "\n".join([title, "", *lines]) + "\n</doc>\n"


@pytest.mark.parametrize("name", SLICE)
def test_every_article_is_read_once(extracted: Path, name: str):
    path = extracted / name
    blocks = _DOC_OPEN.findall(bz2.decompress(path.read_bytes()))
    items = read(path, "wikiextractor", f"AA/{name}")
    counted = reasons(items)
    # every <doc> block is a document or one counted skip, nothing else is skipped
    assert len(documents(items)) + counted[SkipReason.DISAMBIGUATION.value] + \
        counted[SkipReason.EMPTY_DOCUMENT.value] == len(blocks)
    assert set(counted) <= {SkipReason.DISAMBIGUATION.value, SkipReason.EMPTY_DOCUMENT.value}
    assert_keys(items, f"AA/{name}")
    titles = {title.decode() for _, title in blocks}
    skipped_titles = {re.match(r"'(.*)' \(id", s.detail).group(1) for s in skips(items)}
    assert skipped_titles <= titles
    for document in documents(items):
        assert document.paragraphs[0] not in titles        # the title line is dropped
        assert not any("#if:" in p or "{{" in p or "<doc" in p for p in document.paragraphs)


def test_detected_by_content_whatever_the_name(extracted: Path, tmp_path: Path, shared_data: Path):
    plain = bz2.decompress((extracted / "wiki_00.bz2").read_bytes())
    for name in ("wiki_00", "articles.txt", "part-0001.xml"):
        (tmp_path / name).write_bytes(plain)
        assert detect_format(str(tmp_path / name)) == "wikiextractor"
    assert detect_format(str(extracted / "wiki_00.bz2")) == "wikiextractor"
    dump = (shared_data / "corpora" / "wikipedia"
            / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
    shutil.copy(dump, tmp_path / "dump.txt.bz2")          # a MediaWiki export named like a compressed book
    assert detect_format(str(tmp_path / "dump.txt.bz2")) == "wikipedia"
    (tmp_path / "book.txt.bz2").write_bytes(bz2.compress(b"It was a truth universally acknowledged.\n"))
    assert detect_format(str(tmp_path / "book.txt.bz2")) == "books"


def test_truncated_bz2_keeps_the_articles_before_the_damage(extracted: Path, tmp_path: Path):
    # the largest file, cut after its first bz2 block (900 kB of text, about 270 kB packed) and within its second
    whole = read(extracted / "wiki_95.bz2", "wikiextractor", "w")
    data = (extracted / "wiki_95.bz2").read_bytes()
    (tmp_path / "wiki_95.bz2").write_bytes(data[: len(data) * 9 // 10])
    cut = read(tmp_path / "wiki_95.bz2", "wikiextractor", "w")
    assert skips(cut, SkipReason.CORRUPT_COMPRESSION.value)
    kept = documents(cut)
    assert 0 < len(kept) < len(documents(whole))
    assert kept == documents(whole)[: len(kept)]           # a prefix, whole articles only, the same keys


def test_title_line_dropped_debris_removed_paragraph_per_line(tmp_path: Path):
    text = doc("Anarchism", "Anarchism is a political philosophy that rejects rulers.",
               " #if: ", " }}{{", " |, ", "History.", "The <b>first</b> use of the word was in 1539 &amp; later.")
    path = tmp_path / "wiki_00"
    path.write_text(text, encoding="utf-8")
    (document,) = documents(read(path, "wikiextractor", "AA/wiki_00"))
    assert document.key == "AA/wiki_00:0" and document.title == "Anarchism"   # metadata: not in the text
    assert document.paragraphs == ("Anarchism is a political philosophy that rejects rulers.",
                                   "The first use of the word was in 1539 & later.")


def test_empty_disambiguation_and_unclosed_articles_are_counted(tmp_path: Path):
    text = (doc("Empty page", page_id=1)
            + doc("Alien", "Alien may refer to:", page_id=2)
            + doc("Austin (disambiguation)", "Austin is the capital of Texas in the United States.",
                  "Austin may also refer to:", page_id=3)
            + doc("Anaconda", "An anaconda is a large snake found in tropical South America.",
                  "Anaconda may refer to:", "The name commonly used in Brazil is sucuri, from the Tupi language.",
                  page_id=4)
            + 'stray text between blocks\n'
            + '<doc id="5" url="u" title="Cut">\nCut\n\nThis article never ends because the file was cut off here.\n')
    path = tmp_path / "wiki_01"
    path.write_text(text, encoding="utf-8")
    items = read(path, "wikiextractor", "wiki_01")
    assert [d.paragraphs[0][:12] for d in documents(items)] == ["An anaconda "]
    assert reasons(items) == {SkipReason.EMPTY_DOCUMENT.value: 1, SkipReason.DISAMBIGUATION.value: 2,
                              SkipReason.MALFORMED_RECORD.value: 2}
    assert "'Cut' (id 5" in skips(items, SkipReason.MALFORMED_RECORD.value)[0].detail


def test_disambiguation_rule():
    assert is_disambiguation("Atlas (disambiguation)", ["An atlas is a collection of maps."])
    assert is_disambiguation("Capital", ["Capital may refer to:", "Forms of capital.", "See also: ."])
    assert is_disambiguation("Greek", ["Greek may refer to anything of, from, or related to Greece, a country.",
                                       "Other uses.", "Greek may also refer to:"])
    assert not is_disambiguation("Cytology", ["Cytology is the study of cells in terms of structure and function.",
                                              "Based on usage it can refer to:",
                                              "The International Academy of Cytology has its own official journal."])


def test_bad_files_are_counted_not_raised(tmp_path: Path):
    (tmp_path / "empty").write_bytes(b"")
    assert reasons(read(tmp_path / "empty", "wikiextractor")) == {SkipReason.EMPTY_FILE.value: 1}
    (tmp_path / "garbage.bz2").write_bytes(b"BZh91AY&SY" + b"\x00" * 200)
    assert reasons(read(tmp_path / "garbage.bz2", "wikiextractor")) == {SkipReason.CORRUPT_COMPRESSION.value: 1}
