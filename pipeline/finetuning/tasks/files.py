"""Looking at a task's files line by line: the header, the first row, and where a given row lies in the file.

pandas (under ``datasets``' csv builder) reads the rows fast but cannot say which line of the file a row came from,
nor tell a missing trailing field from an empty one (both come back as ""), nor object to extra fields in the first
row (it drops them with a warning).  Python's csv module, with the same delimiter and quoting, splits a file into
the same records and knows each one's line number, so this module answers those questions on the (rare) paths that
need them.  Blank lines are skipped here as pandas skips them, so record ``k`` here is row ``k`` of the dataset.
"""
from __future__ import annotations

import array
import csv
import sys
from collections.abc import Iterator
from pathlib import Path

# Some MNLI/QQP rows are long; csv's default limit (128 KiB per field) is not a property of the data.
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))

ROW_PREVIEW_CHARS = 300
"""How much of an offending row an error message shows."""


def _records(path: Path, delimiter: str, quoted: bool) -> Iterator[tuple[int, list[str]]]:
    """``(1-based line number where the record starts, fields)`` for every non-blank record."""
    # newline="" hands line ends to csv, which treats \r\n, \n and \r as pandas' C parser does.
    with open(path, encoding="utf-8-sig", newline="") as stream:
        reader = csv.reader(stream, delimiter=delimiter, quoting=csv.QUOTE_MINIMAL if quoted else csv.QUOTE_NONE)
        line = 1
        try:
            for fields in reader:
                if fields:
                    yield line, fields
                line = reader.line_num + 1
        except UnicodeDecodeError as error:
            raise not_utf8_error(path) from error


def not_utf8_error(path: Path) -> ValueError:
    """The error for a file that is not UTF-8, naming its first bad line."""
    found = first_non_utf8_line(path)
    where = f"{path}, line {found[0]}" if found else str(path)
    shown = f": {found[1][:200]!r}" if found else ""
    return ValueError(f"{where}: not UTF-8 text{shown}. Re-encode the file as UTF-8 (GLUE's files are).")


def first_records(path: Path, delimiter: str, quoted: bool, count: int = 2) -> list[tuple[int, list[str]]]:
    """The first ``count`` non-blank records (header and first row, for a file with a header)."""
    found = []
    for record in _records(path, delimiter, quoted):
        found.append(record)
        if len(found) == count:
            break
    return found


def preview(fields: list[str], delimiter: str) -> str:
    """An offending row as it reads in the file, shortened for a message."""
    text = delimiter.join(fields)
    return repr(text if len(text) <= ROW_PREVIEW_CHARS else text[:ROW_PREVIEW_CHARS] + "...")


class RecordLines:
    """Row number (0-based, as ``datasets`` counts a file's rows) -> line number and field count.

    Built by one pass over the file on first use; only error paths and rows with empty fields use it.
    """

    def __init__(self, path: Path, delimiter: str, quoted: bool, header: bool):
        self.path = path
        self.delimiter = delimiter
        self.quoted = quoted
        self.header = header
        self._lines: array.array | None = None
        self._fields: array.array | None = None

    def _build(self) -> None:
        lines, fields = array.array("q"), array.array("q")
        records = _records(self.path, self.delimiter, self.quoted)
        if self.header:
            next(records, None)
        for line, row in records:
            lines.append(line)
            fields.append(len(row))
        self._lines, self._fields = lines, fields

    def locate(self, row: int) -> tuple[int, int]:
        """``(line number, number of fields)`` of the dataset's row ``row``."""
        if self._lines is None:
            self._build()
        if not 0 <= row < len(self._lines):
            raise IndexError(f"{self.path}: row {row} not found (the file has {len(self._lines)} rows); "
                             "the csv module and pandas disagree on where its records are")
        return self._lines[row], self._fields[row]

    def fields_at(self, line: int) -> list[str]:
        """The fields of the record starting at ``line``."""
        for number, fields in _records(self.path, self.delimiter, self.quoted):
            if number == line:
                return fields
        return []


def first_long_record(path: Path, delimiter: str, quoted: bool, header: bool, most: int
                      ) -> tuple[int, list[str]] | None:
    """The first row with more than ``most`` fields, or None."""
    records = _records(path, delimiter, quoted)
    if header:
        next(records, None)
    for line, fields in records:
        if len(fields) > most:
            return line, fields
    return None


def first_non_utf8_line(path: Path) -> tuple[int, bytes] | None:
    """The first line that is not UTF-8 (line number, its bytes), or None."""
    with open(path, "rb") as stream:
        for number, raw in enumerate(stream, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return number, raw
    return None
