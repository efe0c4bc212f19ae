"""MediaWiki XML export (``pages-articles`` dumps, any schema version), plain or bz2/gzip, to clean paragraphs.

Streamed: the XML is fed chunk by chunk to a pull parser and each ``<page>`` is dropped from the tree once it
has been read, so memory stays at about one page plus the decompression look-behind (see ``_io``).
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import mwparserfromhell
from mwparserfromhell.nodes import (
    Argument,
    Comment,
    ExternalLink,
    Heading,
    HTMLEntity,
    Tag,
    Template,
    Text,
    Wikilink,
)
from mwparserfromhell.parser import ParserError

from data_prep.documents import Document, Skip, SkipReason
from data_prep.readers._io import COMPRESSED_LAG, InputError, iter_bytes
from data_prep.readers.prose import has_text, is_prose_line, is_prose_list_item

# --- wikitext to paragraphs ---------------------------------------------------------------------------------

# Tags whose content is not running prose: references, tables, galleries, formulas, code blocks, graphs...
_DROPPED_TAGS = frozenset({
    "ref", "references", "table", "gallery", "math", "chem", "ce", "hiero", "score", "timeline", "graph",
    "imagemap", "mapframe", "maplink", "templatedata", "templatestyles", "categorytree", "inputbox", "section",
    "charinsert", "indicator", "syntaxhighlight", "source", "pre", "includeonly", "noinclude", "math-chem",
    "ref-group", "references-group", "poem-ref",
})
_LINE_BREAK_TAGS = frozenset({"br", "hr", "p", "div", "blockquote", "center", "poem"})
_LIST_MARKUP = frozenset({"*", "#", ";", ":"})
_LIST_TAGS = frozenset({"li", "dt", "dd"})
_MEDIA_NAMESPACES = frozenset({"file", "image", "media"})
_INTERWIKI_PROJECTS = frozenset({
    "wikt", "wiktionary", "s", "wikisource", "q", "wikiquote", "b", "wikibooks", "n", "wikinews", "v",
    "wikiversity", "voy", "wikivoyage", "commons", "meta", "m", "species", "wikispecies", "d", "wikidata", "mw",
})
_LANGUAGE_PREFIX = re.compile(r"[a-z]{2,3}(?:-[a-z0-9]{2,8})*|simple")
_LIST_MARK = "\x00"  # cannot occur in XML 1.0 text, so it cannot come from the page
_HIDDEN_LT = "\x01"  # nor can these
_HIDDEN_BRACKET = "\x02"
_MAX_TAG_OPENERS = 5000  # after refs and comments are cut; the sample's most is 645
_MAX_EXTERNAL_LINKS = 5000
_EXTERNAL_LINK_OPEN = re.compile(r"\[(?=https?:|//|ftp:|mailto:)", re.IGNORECASE)
_HIDDEN_EXTERNAL_LINK = re.compile("\x02[^\\s\\]\x02]{1,2000}(?:[ \t]([^\\]\n\x02]{0,500}))?\\]")

_MAGIC_WORD = re.compile(r"__[A-Z]{3,}__")
_LEFTOVER_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")
_DROPPED_TAG_NAMES = "|".join(sorted(_DROPPED_TAGS, key=len, reverse=True))
_DROPPED_TAG_TOKEN = re.compile(rf"<(/?)\s*({_DROPPED_TAG_NAMES})\b[^<>]*?(/?)>", re.IGNORECASE)
_LEFTOVER_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9-]*(?:\s[^<>]*)?/?>")
_LEFTOVER_QUOTES = re.compile(r"'{2,}")
_EMPTY_PARENTHESES = re.compile(r"(?<=\s)\([\s,;:]*\)")
_LEFTOVER_LINK = re.compile(r"\[\[\s*:?\s*(?:file|image|media|category)\s*:", re.IGNORECASE)
_LINK_BRACKETS = re.compile(r"\[\[|\]\]")
_TABLE_LINE = re.compile(r"^(?:\{\||\|\}|\|-|\||!)")
_REDIRECT_TEXT = re.compile(r"^\s*#\s*redirect\b", re.IGNORECASE)

# Which lines survive: data_prep.readers.prose (the "debris" rule). Kept lines that follow each other form one
# paragraph (a single newline does not break a paragraph in wikitext); a blank or dropped line ends it, and each
# kept list item is a paragraph of its own.


def _render(code, out: list[str]) -> None:
    """Append the visible prose of a parsed wikicode to ``out`` (recursive over link texts and tag contents)."""
    for node in code.nodes:
        if isinstance(node, Text):
            out.append(node.value)
        elif isinstance(node, (Template, Argument, Comment)):
            continue
        elif isinstance(node, Wikilink):
            _render_wikilink(node, out)
        elif isinstance(node, Tag):
            _render_tag(node, out)
        elif isinstance(node, HTMLEntity):
            out.append(node.normalize())
        elif isinstance(node, Heading):
            out.append("\n\n")
        elif isinstance(node, ExternalLink):
            if not node.brackets:
                out.append(str(node.url))
            elif node.title is not None:  # [http://x.org words] shows the words; [http://x.org] shows "[1]"
                _render(node.title, out)
        # any other node kind (none today) is left out


def _render_wikilink(node: Wikilink, out: list[str]) -> None:
    title = str(node.title).strip()
    inline = title.startswith(":")  # [[:Category:X|text]] is a visible link, not a categorisation
    prefix, colon, _ = title.lstrip(":").partition(":")
    prefix = prefix.strip()
    if colon:
        name = prefix.lower()
        if name in _MEDIA_NAMESPACES or name == "category":
            if inline and node.text is not None:
                _render(node.text, out)
            return
        if node.text is None and not inline and _LANGUAGE_PREFIX.fullmatch(prefix) and name not in _INTERWIKI_PROJECTS:
            return  # interlanguage link [[de:Anarchismus]]: not shown in the text
    if node.text is not None:
        _render(node.text, out)
    else:
        _render(node.title, out)


def _render_tag(node: Tag, out: list[str]) -> None:
    name = str(node.tag).strip().lower()
    if node.wiki_markup in _LIST_MARKUP or name in _LIST_TAGS:
        out.append(_LIST_MARK)
    elif name in _DROPPED_TAGS:
        return
    elif name in _LINE_BREAK_TAGS:
        out.append("\n")
    if node.contents is not None and not node.self_closing:
        _render(node.contents, out)
        if name in _LINE_BREAK_TAGS:
            out.append("\n")


def _drop_leftover_links(line: str) -> str:
    """Remove [[File:...]]/[[Category:...]] links the parser left as text, nested [[links]] in captions included."""
    pieces: list[str] = []
    pos = 0
    while (match := _LEFTOVER_LINK.search(line, pos)) is not None:
        pieces.append(line[pos:match.start()])
        depth, end = 0, len(line)  # unclosed: to the end of the line
        for bracket in _LINK_BRACKETS.finditer(line, match.start()):
            depth += 1 if bracket.group() == "[[" else -1
            if depth == 0:
                end = bracket.end()
                break
        pos = end
    pieces.append(line[pos:])
    return "".join(pieces)


def _drop_leftover_tags(text: str) -> str:
    """Remove what is left of dropped tags (<ref>...</ref>, <math/>) in one pass; an unclosed one loses only its tag."""
    tokens = list(_DROPPED_TAG_TOKEN.finditer(text))
    if not tokens:
        return text
    last_close: dict[str, int] = {}
    for token in tokens:
        if token.group(1):
            last_close[token.group(2).lower()] = token.start()
    pieces: list[str] = []
    pos = 0
    skipping: str | None = None  # inside <name>...: drop until </name>
    for token in tokens:
        name = token.group(2).lower()
        if skipping is not None:
            if token.group(1) and name == skipping:
                skipping, pos = None, token.end()
            continue
        pieces.append(text[pos:token.start()])
        pos = token.end()
        if not token.group(1) and not token.group(3) and last_close.get(name, -1) > token.start():
            skipping = name
    pieces.append(text[pos:])
    return "".join(pieces)


_REF_OPEN = re.compile(r"<ref\b[^<>]*>", re.IGNORECASE)
_REF_CLOSE = re.compile(r"</ref\s*>", re.IGNORECASE)


def _cut_refs_and_comments(wikitext: str) -> str:
    """Remove <!-- comments --> and <ref>...</ref> before parsing: half of the parser's work on a typical article.

    One linear scan (a regex with ``.*?`` would rescan to the end for every unclosed tag).  An unclosed comment
    hides the rest of the page, as in MediaWiki; an unclosed <ref> loses only its opening tag (MediaWiki shows
    it as text), which also spares the parser, slow on many unclosed tags.
    """
    out: list[str] = []
    pos = 0
    comment = wikitext.find("<!--")
    ref = _REF_OPEN.search(wikitext)
    closes_left = True  # False once no </ref> is left after pos
    while comment >= 0 or ref is not None:
        if ref is None or 0 <= comment < ref.start():
            out.append(wikitext[pos:comment])
            end = wikitext.find("-->", comment + 4)
            if end < 0:
                return "".join(out)
            pos = end + 3
        else:
            out.append(wikitext[pos:ref.start()])
            pos = ref.end()
            if not ref.group().endswith("/>") and closes_left:
                close = _REF_CLOSE.search(wikitext, pos)
                if close is None:
                    closes_left = False
                else:
                    pos = close.end()
        if 0 <= comment < pos:
            comment = wikitext.find("<!--", pos)
        if ref is not None and ref.start() < pos:
            ref = _REF_OPEN.search(wikitext, pos)
    out.append(wikitext[pos:])
    return "".join(out)


def clean_wikitext(wikitext: str) -> tuple[str, ...]:
    """Wikitext to clean paragraphs: markup, templates, references, tables, media, categories, headings removed.

    Raises ``mwparserfromhell.parser.ParserError`` only on a parser bug (the reader counts it as a skip).
    """
    text = _cut_refs_and_comments(wikitext)
    # mwparserfromhell takes time quadratic in the number of unclosed tags and external links ("<div>" * 4000:
    # 1.5 s).  A page with more tag openers or external links than any real article has them hidden from the
    # parser and cleaned up as leftovers below.
    hide_tags = text.count("<") > _MAX_TAG_OPENERS
    if hide_tags:
        text = text.replace("<", _HIDDEN_LT)
    hide_links = text.count("[http") + text.count("[//") > _MAX_EXTERNAL_LINKS
    if hide_links:
        text = _EXTERNAL_LINK_OPEN.sub(_HIDDEN_BRACKET, text)
    out: list[str] = []
    _render(mwparserfromhell.parse(text), out)
    text = _MAGIC_WORD.sub("", "".join(out))
    if hide_tags:
        text = text.replace(_HIDDEN_LT, "<")
    if hide_links:
        text = _HIDDEN_EXTERNAL_LINK.sub(lambda m: m.group(1) or "", text).replace(_HIDDEN_BRACKET, "[")
    # markup the parser could not make sense of (an unbalanced '' inside a <ref> makes it give the tag up) is
    # left as text: remove what is left of the tags we drop, then any other tag and bold/italic quotes
    text = _drop_leftover_tags(text)
    text = _LEFTOVER_TAG.sub("", text)
    text = _LEFTOVER_QUOTES.sub("", text)
    text = _EMPTY_PARENTHESES.sub("", text)  # "Asia ({{IPA|...}}) is" -> "Asia () is" -> "Asia is"
    paragraphs: list[str] = []
    current: list[str] = []

    def end_paragraph() -> None:
        if current:
            paragraphs.append(" ".join(current))
            current.clear()

    for raw_line in text.split("\n"):
        stripped = raw_line.strip()
        is_list = stripped.startswith(_LIST_MARK)
        line = " ".join(stripped.replace(_LIST_MARK, " ").split())
        # what a parser gave up on stays as text: a template it could not close, a table row, a "== x =="
        line = _LEFTOVER_TEMPLATE.sub("", line)
        heading = line.startswith("=") and line.endswith("=") and line.strip("= ") != ""
        if "{{" in line or "}}" in line or _TABLE_LINE.match(line) or heading:
            end_paragraph()
            continue
        line = _drop_leftover_links(line)
        line = " ".join(line.replace("[[", "").replace("]]", "").split())
        if not has_text(line):
            end_paragraph()
            continue
        words = line.count(" ") + 1
        if is_list:
            end_paragraph()
            if is_prose_list_item(line, words):
                paragraphs.append(line)
            continue
        if is_prose_line(line, words):
            current.append(line)
        else:
            end_paragraph()
    end_paragraph()
    return tuple(paragraphs)


# --- XML streaming -----------------------------------------------------------------------------------------

def _local(tag: str) -> str:
    """Tag name without its namespace URI: '{http://www.mediawiki.org/xml/export-0.10/}page' -> 'page'."""
    return tag.rsplit("}", 1)[-1]


class _WikiReader:
    def __init__(self, source_name: str):
        self.source = source_name
        self.ordinal = 0
        self.pages = 0
        self.root: ET.Element | None = None
        self.namespace_keys: dict[str, str] = {}  # "Talk" -> "1", from <siteinfo>, for exports without <ns>

    def handle(self, events) -> Iterator[Document | Skip]:
        for event, elem in events:
            if event == "start":
                if self.root is None:
                    self.root = elem
                continue
            name = _local(elem.tag)
            if name == "page":
                self.pages += 1
                yield self.page(elem)
                self.root.clear()  # drop the finished pages: memory stays at about one page
            elif name == "namespace":
                if elem.text and elem.get("key", "0") != "0":
                    self.namespace_keys[elem.text.strip().lower()] = elem.get("key")
            elif name == "siteinfo":
                self.root.clear()

    def page(self, page: ET.Element) -> Document | Skip:
        title, ns, redirect, text = "", None, False, ""
        for child in page:
            name = _local(child.tag)
            if name == "title":
                title = child.text or ""
            elif name == "ns":
                ns = (child.text or "").strip()
            elif name == "redirect":
                redirect = True
            elif name == "revision":  # a full-history export has several: the last one is the current text
                for part in child:
                    if _local(part.tag) == "text":
                        text = part.text or ""
        if ns is None:  # schema 0.3-0.5: no <ns>, the namespace is the title's prefix
            prefix, colon, _ = title.partition(":")
            ns = self.namespace_keys.get(prefix.strip().lower(), "0") if colon else "0"
        if ns != "0":
            return Skip(SkipReason.NON_ARTICLE_NAMESPACE.value, self.source, detail=f"{title} (ns {ns})")
        if redirect or _REDIRECT_TEXT.match(text):
            return Skip(SkipReason.REDIRECT.value, self.source, detail=title)
        try:
            paragraphs = clean_wikitext(text)
        except (ParserError, RecursionError) as error:
            return Skip(SkipReason.MALFORMED_RECORD.value, self.source, detail=f"{title}: wikitext parser: {error}")
        if not paragraphs:
            return Skip(SkipReason.EMPTY_DOCUMENT.value, self.source, detail=title)
        document = Document(f"{self.source}:{self.ordinal}", paragraphs, presplit=False, title=title)
        self.ordinal += 1
        return document


def _compression_error_ahead(chunks: Iterator[bytes], limit: int = 2 * COMPRESSED_LAG) -> InputError | None:
    seen = 0
    try:
        for chunk in chunks:
            seen += len(chunk)
            if seen > limit:
                break
    except InputError as error:
        return error
    return None


def read_wikipedia(path: str, source_name: str) -> Iterator[Document | Skip]:
    """Documents (one per article) and skips from a MediaWiki XML dump; never raises on bad input."""
    reader = _WikiReader(source_name)
    parser = ET.XMLPullParser(events=("start", "end"))
    content = False
    chunks = iter_bytes(path)
    try:
        for chunk in chunks:
            content = content or bool(chunk.strip())
            parser.feed(chunk)
            yield from reader.handle(parser.read_events())
        if not content:
            yield Skip(SkipReason.EMPTY_FILE.value, source_name)
            return
        parser.close()
        yield from reader.handle(parser.read_events())
    except ET.ParseError as error:
        # garbage from a damaged compressed block can break the XML before the block's checksum fails: if the
        # stream fails within the next few MB, the compression is the cause
        cause = _compression_error_ahead(chunks)
        reason, detail = (SkipReason.MALFORMED_XML, str(error)) if cause is None else (cause.reason, cause.detail)
        yield Skip(reason.value, source_name, detail=f"{detail} (after {reader.pages} pages)")
    except InputError as error:
        yield Skip(error.reason.value, source_name, detail=f"{error.detail} (after {reader.pages} pages)")
