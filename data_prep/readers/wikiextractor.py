"""WikiExtractor's output (``wiki_00``, ``wiki_00.bz2`` with ``--compress``): ``<doc>`` blocks of article text.

The input format of NVIDIA's BERT data scripts and LDDL, which many users already have::

    <doc id="12" url="https://en.wikipedia.org/wiki?curid=12" title="Anarchism">
    Anarchism

    Anarchism is a political philosophy ...
    </doc>

Each block is one document; its first line repeats the title and is dropped; every other line is a paragraph.
WikiExtractor leaves debris of templates it could not expand (``#if:``, ``}}{{``, ``|``) and stray HTML tags:
tags are removed and a line is kept when it reads as prose (data_prep.readers.prose, the rule the MediaWiki reader
applies). Empty articles and disambiguation-only ones ("X may refer to:" whose list WikiExtractor dropped) are
counted and skipped. Streamed line by line; a block the input breaks off in (a damaged or truncated bz2) is not
yielded half, and the articles before it are kept.
"""
from __future__ import annotations

import html
import re
from collections.abc import Iterator

from data_prep.documents import Document, Skip, SkipReason
from data_prep.readers._io import MAX_LINE_CHARS, InputError, LineStats, text_lines
from data_prep.readers.prose import has_text, is_prose_line

DOC_OPEN = re.compile(r'^<doc\b([^>]*)>\s*$')
_DOC_CLOSE = "</doc>"
_ATTRIBUTE = re.compile(r'(\w+)="([^"]*)"')
_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9-]*(?:\s[^<>]*)?/?>")
_TEMPLATE_DEBRIS = re.compile(r"\{\{|\}\}|^\s*[|!]|#(?:if|ifeq|switch|expr|invoke|tag):", re.IGNORECASE)
_REFERS_TO = re.compile(r"\b(?:may|can|might|could) (?:also )?(?:refer|be used|mean) to\b", re.IGNORECASE)
_DISAMBIGUATION_TITLE = re.compile(r"\(disambiguation\)\s*$", re.IGNORECASE)
_MAX_DEFINITION_LINES = 1   # a disambiguation page may open with one defining sentence ("Austin is the capital...")
_SENTENCE_WORDS = 5         # shorter lines ending in '.' are WikiExtractor's section headings ("Other uses.")


def prose_paragraphs(lines: list[str]) -> list[str]:
    """The article's lines that read as prose, tags and entities resolved, white space collapsed."""
    kept = []
    for raw in lines:
        if _TEMPLATE_DEBRIS.search(raw):
            continue
        line = " ".join(_TAG.sub(" ", html.unescape(raw)).split())
        if has_text(line) and is_prose_line(line, line.count(" ") + 1):
            kept.append(line)
    return kept


def is_disambiguation(title: str, paragraphs: list[str]) -> bool:
    """A page that only points elsewhere: titled "(disambiguation)", or "may refer to:" with at most one sentence
    of its own besides headings ("Other uses.") and list introductions (lines ending in ':') whose lists
    WikiExtractor dropped."""
    if _DISAMBIGUATION_TITLE.search(title):
        return True
    if not any(_REFERS_TO.search(p) for p in paragraphs):
        return False
    own_lines = [p for p in paragraphs if not p.endswith(":") and p.count(" ") + 1 >= _SENTENCE_WORDS]
    return len(own_lines) <= _MAX_DEFINITION_LINES


class _Article:
    def __init__(self, header: str, line_number: int):
        attributes = dict(_ATTRIBUTE.findall(header))
        self.title = html.unescape(attributes.get("title", "")).strip()
        self.page_id = attributes.get("id", "")
        self.line_number = line_number
        self.lines: list[str] = []

    def label(self) -> str:
        return f"{self.title!r} (id {self.page_id}, line {self.line_number})"

    def body(self) -> list[str]:
        lines = list(self.lines)
        while lines and not lines[0].strip():
            lines.pop(0)
        if lines and lines[0].strip() == self.title:   # WikiExtractor repeats the title as the first line
            lines.pop(0)
        return lines


def _finish(article: _Article, source_name: str, ordinal: int) -> Document | Skip:
    paragraphs = prose_paragraphs(article.body())
    if not paragraphs:
        return Skip(SkipReason.EMPTY_DOCUMENT.value, source_name, detail=article.label())
    if is_disambiguation(article.title, paragraphs):
        return Skip(SkipReason.DISAMBIGUATION.value, source_name, detail=article.label())
    return Document(f"{source_name}:{ordinal}", tuple(paragraphs), presplit=False, title=article.title)


def read_wikiextractor(path: str, source_name: str, max_line_chars: int = MAX_LINE_CHARS
                       ) -> Iterator[Document | Skip]:
    """Documents (one per ``<doc>`` block) and skips from a WikiExtractor output file; never raises on bad input.
    A line over ``max_line_chars`` is left out of its article and counted."""
    stats = LineStats()
    ordinal = 0
    article: _Article | None = None
    stray_lines = 0
    try:
        for number, line in text_lines(path, stats, max_line_chars):
            if article is None:
                match = DOC_OPEN.match(line)
                if match:
                    article = _Article(match.group(1), number)
                elif line.strip():
                    stray_lines += 1
                continue
            if line.strip() == _DOC_CLOSE:
                item = _finish(article, source_name, ordinal)
                ordinal += isinstance(item, Document)
                yield item
                article = None
            elif DOC_OPEN.match(line):   # a block opened inside another: the unclosed one is malformed
                yield Skip(SkipReason.MALFORMED_RECORD.value, source_name,
                           detail=f"{article.label()}: no </doc> before the next <doc>")
                article = _Article(DOC_OPEN.match(line).group(1), number)
            else:
                article.lines.append(line)
    except InputError as error:
        # the article the error cut off is not yielded half; the ones before it are kept
        yield Skip(error.reason.value, source_name, detail=f"{error.detail} (after {ordinal} documents)")
    else:
        if article is not None:
            yield Skip(SkipReason.MALFORMED_RECORD.value, source_name, detail=f"{article.label()}: no </doc>")
        if not stats.content:
            yield Skip(SkipReason.EMPTY_FILE.value, source_name)
    if stray_lines:
        yield Skip(SkipReason.MALFORMED_RECORD.value, source_name,
                   detail=f"{stray_lines} lines outside any <doc> block (left out)")
    yield from stats.closing_skips(source_name, max_line_chars)
