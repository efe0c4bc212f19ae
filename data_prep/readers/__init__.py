"""Readers: one input file to a stream of ``Document``s and ``Skip``s.

``read_documents`` never raises on bad input (Beam would retry the bundle forever): every problem with a file
is yielded as a counted ``Skip`` (or a ``Repair`` record) and the reader goes on or stops that file.
Document keys are ``f"{source_name}:{ordinal}"``, the ordinal counting the documents this file yields.
Files are opened through Beam's ``FileSystems`` (gs:// on Dataflow) and decompressed here (bz2, gzip,
recognised by their magic bytes); all formats but ``books`` (one book = one document) are streamed.
A file's format is recognised by its content where the content says it (a MediaWiki export, WikiExtractor's
``<doc>`` blocks, Parquet), else by its name.
"""
from __future__ import annotations

from collections.abc import Iterator

from data_prep.documents import Document, Skip
from data_prep.readers._io import MAX_LINE_CHARS

__all__ = ["FORMATS", "MAX_LINE_CHARS", "detect_format", "format_from_content", "format_from_name", "read_documents"]

FORMATS = ("wikipedia", "wikiextractor", "books", "sentences", "jsonl", "parquet")

_COMPRESSION_SUFFIXES = (".bz2", ".gz")
_SNIFF_BYTES = 4096
_BOM = b"\xef\xbb\xbf"


def detect_format(path: str) -> str:
    """The format of the file at ``path``: by its content where that is conclusive, else by its name."""
    return format_from_content(path) or format_from_name(path)


def format_from_content(path: str) -> str | None:
    """'wikipedia' for a MediaWiki XML export, 'wikiextractor' for ``<doc>`` blocks, 'parquet' for a Parquet
    file, looked up in the first bytes (decompressed); None where they say nothing conclusive or the file
    cannot be read (the reader then counts the problem)."""
    from data_prep.readers._io import InputError, iter_bytes, open_file
    from data_prep.readers.wikiextractor import DOC_OPEN

    try:
        with open_file(path) as handle:
            if handle.read(4) == b"PAR1":
                return "parquet"
        head = b""
        for chunk in iter_bytes(path, lag=0):
            head += chunk
            if len(head) >= _SNIFF_BYTES:
                break
    except InputError:
        return None
    text = head[:_SNIFF_BYTES].removeprefix(_BOM).lstrip()
    first_line = text.split(b"\n", 1)[0].decode("utf-8", errors="replace")
    if DOC_OPEN.match(first_line):
        return "wikiextractor"
    if text.startswith(b"<mediawiki") or (text.startswith(b"<?xml") and b"<mediawiki" in text):
        return "wikipedia"
    return None


def format_from_name(path: str) -> str:
    """The format a file's name implies; ``sentences`` is never guessed (it looks like ``books``).

    ``.xml`` (optionally ``.bz2``/``.gz``) and any other ``.bz2`` but ``.txt.bz2`` (dump shards are named
    ``...pages-articles1.xml-p10p30302.bz2``) -> wikipedia; ``.jsonl``/``.json``/``.ndjson`` (optionally
    compressed) -> jsonl; ``.parquet`` -> parquet; anything else (``.txt``) -> books.
    """
    name = path.rstrip("/").rsplit("/", 1)[-1].lower()
    compression = next((s for s in _COMPRESSION_SUFFIXES if name.endswith(s)), "")
    base = name[: len(name) - len(compression)]
    if base.endswith(".xml"):
        return "wikipedia"
    if base.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if base.endswith(".parquet"):
        return "parquet"
    if compression == ".bz2" and not base.endswith(".txt"):
        return "wikipedia"
    return "books"


def read_documents(
    path: str, fmt: str, source_name: str, *, text_column: str = "text", max_line_chars: int = MAX_LINE_CHARS
) -> Iterator[Document | Skip]:
    """Documents and skips of one file.  ``fmt`` must be one of :data:`FORMATS` (else ``ValueError``: a bug).

    Lines over ``max_line_chars`` are left out and counted (``line_too_long``) by every reader of lines; a MediaWiki
    dump is XML, whose pages the tokenizing step bounds by sentence instead.
    """
    if fmt == "wikipedia":
        from data_prep.readers.wikipedia import read_wikipedia

        return read_wikipedia(path, source_name)
    if fmt == "wikiextractor":
        from data_prep.readers.wikiextractor import read_wikiextractor

        return read_wikiextractor(path, source_name, max_line_chars)
    if fmt == "books":
        from data_prep.readers.books import read_book

        return read_book(path, source_name, max_line_chars)
    if fmt == "sentences":
        from data_prep.readers.sentences import read_sentences

        return read_sentences(path, source_name, max_line_chars)
    if fmt == "jsonl":
        from data_prep.readers.tabular import read_jsonl

        return read_jsonl(path, source_name, text_column, max_line_chars)
    if fmt == "parquet":
        from data_prep.readers.tabular import read_parquet

        return read_parquet(path, source_name, text_column, max_line_chars)
    raise ValueError(f"unknown input format {fmt!r}; expected one of {FORMATS}")
