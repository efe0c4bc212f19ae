"""Readers: one input file to a stream of ``Document``s and ``Skip``s.

``read_documents`` never raises on bad input (Beam would retry the bundle forever): every problem with a file
is yielded as a counted ``Skip`` (or a ``Repair`` record) and the reader goes on or stops that file.
Document keys are ``f"{source_name}:{ordinal}"``, the ordinal counting the documents this file yields.
Files are opened through Beam's ``FileSystems`` (gs:// on Dataflow) and decompressed here (bz2, gzip,
recognised by their magic bytes); all formats but ``books`` (one book = one document) are streamed.
"""
from __future__ import annotations

from typing import Iterator

from data_prep.documents import Document, Skip

__all__ = ["FORMATS", "detect_format", "read_documents"]

FORMATS = ("wikipedia", "books", "sentences", "jsonl", "parquet")

_COMPRESSION_SUFFIXES = (".bz2", ".gz")


def detect_format(path: str) -> str:
    """The format a file's name implies; ``sentences`` is never guessed (it looks like ``books``).

    ``.xml`` (optionally ``.bz2``/``.gz``) and any other ``.bz2`` (dump shards are named
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
    if compression == ".bz2":
        return "wikipedia"
    return "books"


def read_documents(
    path: str, fmt: str, source_name: str, *, text_column: str = "text"
) -> Iterator[Document | Skip]:
    """Documents and skips of one file.  ``fmt`` must be one of :data:`FORMATS` (else ``ValueError``: a bug)."""
    if fmt == "wikipedia":
        from data_prep.readers.wikipedia import read_wikipedia

        return read_wikipedia(path, source_name)
    if fmt == "books":
        from data_prep.readers.books import read_book

        return read_book(path, source_name)
    if fmt == "sentences":
        from data_prep.readers.sentences import read_sentences

        return read_sentences(path, source_name)
    if fmt == "jsonl":
        from data_prep.readers.tabular import read_jsonl

        return read_jsonl(path, source_name, text_column)
    if fmt == "parquet":
        from data_prep.readers.tabular import read_parquet

        return read_parquet(path, source_name, text_column)
    raise ValueError(f"unknown input format {fmt!r}; expected one of {FORMATS}")
