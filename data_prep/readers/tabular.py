"""Record formats: JSON Lines (one object per line) and Parquet (a string column), one document per record.

A record's text is split into paragraphs at blank lines; inside a paragraph, runs of white space (single line
breaks included) become one space.  Bad records are counted and skipped; the file goes on.  Lines over
``max_line_chars`` are counted and left out: a JSONL record is one line of the file (so a longer record is left out
whole, never held), a Parquet value's own lines are left out of it (the value is in memory already).
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator

from data_prep.documents import Document, Repair, Skip, SkipReason
from data_prep.readers._io import MAX_LINE_CHARS, InputError, LineStats, open_file, text_lines
from data_prep.text_decoding import decode_text

_BLANK_LINE = re.compile(r"\n[^\S\n]*\n\s*")
_SURROGATE = re.compile("[\ud800-\udfff]")

PARQUET_BATCH_ROWS = 512
"""Rows per Arrow batch: records are whole documents, so keep batches small."""


def text_paragraphs(text: str) -> tuple[str, ...]:
    """Paragraphs of a record's text: split at blank lines, white space collapsed, empty ones dropped."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    paragraphs = (" ".join(block.split()) for block in _BLANK_LINE.split(text))
    return tuple(p for p in paragraphs if p)


def _valid_unicode(text: str) -> str:
    """JSON can carry lone surrogates ("\\ud800"), which no UTF-8 writer downstream accepts: make them U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def read_jsonl(path: str, source_name: str, text_column: str = "text", max_line_chars: int = MAX_LINE_CHARS
               ) -> Iterator[Document | Skip]:
    """One document per JSON object line (text in ``text_column``); never raises on bad input."""
    stats = LineStats()
    ordinal = 0
    try:
        for number, line in text_lines(path, stats, max_line_chars):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as error:  # JSONDecodeError is a ValueError; deep nesting recurses
                yield Skip(SkipReason.MALFORMED_RECORD.value, source_name,
                           detail=f"line {number}: not JSON ({type(error).__name__}: {str(error)[:120]})")
                continue
            if not isinstance(record, dict):
                yield Skip(SkipReason.MALFORMED_RECORD.value, source_name,
                           detail=f"line {number}: a JSON {type(record).__name__}, not an object")
                continue
            text = record.get(text_column)
            if not isinstance(text, str):
                what = "missing" if text_column not in record else f"a {type(text).__name__}, not a string"
                yield Skip(SkipReason.MALFORMED_RECORD.value, source_name,
                           detail=f"line {number}: column {text_column!r} is {what}")
                continue
            paragraphs = text_paragraphs(_valid_unicode(text))
            if not paragraphs:
                yield Skip(SkipReason.EMPTY_DOCUMENT.value, source_name, detail=f"line {number}")
                continue
            yield Document(f"{source_name}:{ordinal}", paragraphs, presplit=False)
            ordinal += 1
    except InputError as error:
        yield Skip(error.reason.value, source_name, detail=f"{error.detail} (after {ordinal} documents)")
    else:
        if not stats.content:
            yield Skip(SkipReason.EMPTY_FILE.value, source_name)
    yield from stats.closing_skips(source_name, max_line_chars)


def _column_kind(arrow_type) -> str | None:
    """'text' for string columns, 'bytes' for binary ones (decoded as text), None for anything else."""
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or (
        hasattr(pa.types, "is_string_view") and pa.types.is_string_view(arrow_type)
    ):
        return "text"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "bytes"
    return None


def read_parquet(path: str, source_name: str, text_column: str = "text", max_line_chars: int = MAX_LINE_CHARS
                 ) -> Iterator[Document | Skip]:
    """One document per row of the string column ``text_column``, read in small batches; never raises on bad input.

    A file without the column (or with a non-string one) gives ONE ``Skip(MALFORMED_RECORD, count=<rows>)``;
    null and empty values are counted per batch.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        fileobj = open_file(path)
    except InputError as error:
        yield Skip(error.reason.value, source_name, detail=error.detail)
        return
    arrow_errors = (OSError, ValueError, pa.ArrowException)
    try:
        try:
            if not fileobj.read(1):
                yield Skip(SkipReason.EMPTY_FILE.value, source_name)
                return
            fileobj.seek(0)
            parquet = pq.ParquetFile(fileobj)
            schema = parquet.schema_arrow
            rows = parquet.metadata.num_rows
        except arrow_errors as error:
            yield Skip(SkipReason.UNREADABLE_FILE.value, source_name,
                       detail=f"not a readable Parquet file: {type(error).__name__}: {error}")
            return
        if rows == 0:
            yield Skip(SkipReason.EMPTY_FILE.value, source_name, detail="no rows")
            return
        index = schema.get_field_index(text_column)
        if index < 0:
            yield Skip(SkipReason.MALFORMED_RECORD.value, source_name, count=rows,
                       detail=f"no column {text_column!r} (columns: {', '.join(schema.names)[:200]})")
            return
        kind = _column_kind(schema.field(index).type)
        if kind is None:
            yield Skip(SkipReason.MALFORMED_RECORD.value, source_name, count=rows,
                       detail=f"column {text_column!r} is {schema.field(index).type}, not a string")
            return
        yield from _parquet_rows(parquet, source_name, text_column, kind, arrow_errors, max_line_chars)
    finally:
        try:
            fileobj.close()
        except Exception:  # noqa: BLE001 - closing a read-only handle; nothing to lose
            pass


def without_long_lines(text: str, max_line_chars: int) -> tuple[str, int, int]:
    """The text with its lines over ``max_line_chars`` made blank (a paragraph break: the text either side of one
    does not run on), how many there were and the longest one's length."""
    if len(text) <= max_line_chars:
        return text, 0, 0
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    long_lengths = [len(line) for line in lines if len(line) > max_line_chars]
    if not long_lengths:
        return text, 0, 0
    kept = "\n".join("" if len(line) > max_line_chars else line for line in lines)
    return kept, len(long_lengths), max(long_lengths)


def _parquet_rows(parquet, source_name: str, text_column: str, kind: str, arrow_errors, max_line_chars: int
                  ) -> Iterator[Document | Skip]:
    ordinal = 0
    row = 0
    repaired = 0
    batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[text_column])
    while True:
        try:
            batch = next(batches, None)
            values = None if batch is None else batch.column(0).to_pylist()
        except arrow_errors as error:
            yield Skip(SkipReason.UNREADABLE_FILE.value, source_name,
                       detail=f"corrupt Parquet data after row {row}: {type(error).__name__}: {error}")
            break
        if values is None:
            break
        nulls = empties = long_lines = longest = 0
        for value in values:
            if value is None:
                nulls += 1
                continue
            if kind == "bytes":
                value, fixed = decode_text(value)
                repaired += fixed
            value, left_out, length = without_long_lines(value, max_line_chars)
            long_lines, longest = long_lines + left_out, max(longest, length)
            paragraphs = text_paragraphs(value)
            if paragraphs:
                yield Document(f"{source_name}:{ordinal}", paragraphs, presplit=False)
                ordinal += 1
            else:
                empties += 1
        span = f"rows {row}-{row + len(values) - 1}"
        if nulls:
            yield Skip(SkipReason.MALFORMED_RECORD.value, source_name, count=nulls,
                       detail=f"{span}: null {text_column!r}")
        if empties:
            yield Skip(SkipReason.EMPTY_DOCUMENT.value, source_name, count=empties, detail=span)
        if long_lines:
            yield Skip(SkipReason.LINE_TOO_LONG.value, source_name, count=long_lines,
                       detail=f"{span}: longer than max_line_chars={max_line_chars:,}, the longest {longest:,} "
                              "characters")
        row += len(values)
    if repaired:
        yield Skip(Repair.NON_UTF8_LINES.value, source_name, count=repaired)
