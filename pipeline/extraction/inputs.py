"""Input text for feature extraction, read as a stream: one record per line or row, each with its position.

Formats (from the file name, or given):

    text      one sentence per line, or a pair as `A ||| B` (google-research/bert's extract_features.py format)
    csv, tsv  a column of a delimited file with a header row (`column`, and `column_b` for pairs)
    parquet   a column of a Parquet file, read one record batch at a time
    jsonl     a field of one JSON object per line

Nothing stops the run on a bad line; each gets a counted outcome (InputReport):
    empty        an empty or whitespace-only text (or first sentence of a pair): skipped (no output row; the
                 reference stops reading at the first empty line, which silently drops the rest of the file)
    repaired     a line that is not valid UTF-8: decoded as cp1252 (Latin-1 for its five undefined bytes), as
                 data_prep does, and extracted
    bad_record   a JSON line that does not parse, or a row without the column: skipped
Over-long inputs are cut to the sequence length by the featurizer and counted there (extractor.py).

Every record carries `index`, its position in the input (0-based line, or row of a table), which the outputs keep
as `line_index`: rows come out in input order, and a skipped line leaves a gap in the indices, not a shift.
"""
from __future__ import annotations

import collections
import csv
import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path

from data_prep.text_decoding import decode_line

PAIR_SEPARATOR = re.compile(r"^(.*) \|\|\| (.*)$")   # the reference's read_examples
FORMATS = {".txt": "text", ".text": "text", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet",
           ".jsonl": "jsonl", ".json": "jsonl"}


@dataclasses.dataclass
class TextRecord:
    index: int
    text_a: str
    text_b: str | None = None


@dataclasses.dataclass
class InputReport:
    """What reading did with each line or row; extractor.py adds the truncation counts."""
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    examples: dict[str, list[int]] = dataclasses.field(default_factory=dict)   # outcome -> first few indices

    def count(self, outcome: str, index: int) -> None:
        self.counts[outcome] += 1
        shown = self.examples.setdefault(outcome, [])
        if len(shown) < 10:
            shown.append(index)

    def as_dict(self) -> dict:
        return {"counts": dict(self.counts), "first_indices": self.examples}


def detect_format(path: Path, given: str | None = None) -> str:
    if given:
        if given not in set(FORMATS.values()):
            raise ValueError(f"unknown input format {given!r}; known: {', '.join(sorted(set(FORMATS.values())))}")
        return given
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"cannot tell the format of {path} from its name: pass format=text|csv|tsv|parquet|jsonl")
    return FORMATS[suffix]


def count_records(path: Path, fmt: str) -> int | None:
    """The number of lines or rows, for the progress bar (a quick pass; Parquet's footer says it)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq
        return pq.ParquetFile(path).metadata.num_rows
    with path.open("rb") as handle:
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
    with path.open("rb") as handle:   # a last line without a newline counts too
        handle.seek(max(path.stat().st_size - 1, 0))
        lines += path.stat().st_size > 0 and handle.read(1) != b"\n"
    return lines - (1 if fmt in ("csv", "tsv") else 0)


def read_records(path: str | Path, report: InputReport, fmt: str | None = None, column: str | None = None,
                 column_b: str | None = None) -> Iterator[TextRecord]:
    """The records of `path`, in order; what is skipped or repaired is counted in `report`."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"input {path} does not exist")
    fmt = detect_format(path, fmt)
    if fmt == "text":
        if column or column_b:
            raise ValueError("column= and column_b= are for csv/tsv/parquet/jsonl inputs; a text file holds one "
                             "sentence (or `A ||| B`) per line")
        yield from _keep(_text_lines(path, report), report)
        return
    if not column:
        raise ValueError(f"a {fmt} input needs column=<the text column> (and column_b= for sentence pairs)")
    rows = {"csv": _delimited_rows, "tsv": _delimited_rows, "parquet": _parquet_rows, "jsonl": _jsonl_rows}[fmt]
    yield from _keep(rows(path, fmt, column, column_b, report), report)


def _keep(records: Iterator[TextRecord], report: InputReport) -> Iterator[TextRecord]:
    for record in records:
        record.text_a = record.text_a.strip()
        record.text_b = record.text_b.strip() if record.text_b is not None else None
        if not record.text_a:   # a pair's second sentence alone is no input either
            report.count("empty", record.index)
            continue
        report.count("extracted", record.index)
        yield record


def _decoded(raw: bytes, index: int, report: InputReport) -> str:
    text, repaired = decode_line(raw)
    if repaired:
        report.count("repaired", index)
    return text


def _text_lines(path: Path, report: InputReport) -> Iterator[TextRecord]:
    with path.open("rb") as handle:
        for index, raw in enumerate(handle):
            line = _decoded(raw.rstrip(b"\r\n"), index, report).strip()
            pair = PAIR_SEPARATOR.match(line)
            yield TextRecord(index, pair.group(1), pair.group(2)) if pair else TextRecord(index, line)


def _delimited_rows(path: Path, fmt: str, column: str, column_b: str | None,
                    report: InputReport) -> Iterator[TextRecord]:
    # surrogateescape keeps the bytes of a line that is not UTF-8, so that field can be repaired like a text line.
    with path.open(encoding="utf-8", errors="surrogateescape", newline="") as handle:
        # GLUE's TSVs are not quoted (a review may start with a quote character): read tabs literally.
        reader = csv.DictReader(handle, delimiter="\t" if fmt == "tsv" else ",",
                                quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL)
        _check_columns(path, reader.fieldnames or [], column, column_b)
        for index, row in enumerate(reader):
            a, b = row.get(column), row.get(column_b) if column_b else None
            if a is None or (column_b and b is None):
                report.count("bad_record", index)
                continue
            yield TextRecord(index, _repaired_field(a, index, report),
                             _repaired_field(b, index, report) if b is not None else None)


def _repaired_field(value: str, index: int, report: InputReport) -> str:
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:   # lone surrogates: bytes that were not UTF-8
        return _decoded(value.encode("utf-8", errors="surrogateescape"), index, report)


def _check_columns(path: Path, available: list[str], column: str, column_b: str | None) -> None:
    missing = [name for name in (column, column_b) if name and name not in available]
    if missing:
        raise ValueError(f"{path} has no column {', '.join(missing)}; its columns: {', '.join(available)}")


def _parquet_rows(path: Path, fmt: str, column: str, column_b: str | None,
                  report: InputReport) -> Iterator[TextRecord]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    _check_columns(path, parquet.schema_arrow.names, column, column_b)
    index = 0
    for batch in parquet.iter_batches(batch_size=8192, columns=[c for c in (column, column_b) if c]):
        texts_a = batch.column(column).to_pylist()
        texts_b = batch.column(column_b).to_pylist() if column_b else [None] * len(texts_a)
        for a, b in zip(texts_a, texts_b):
            if a is None or (column_b and b is None):
                report.count("bad_record", index)
            else:
                yield TextRecord(index, str(a), str(b) if b is not None else None)
            index += 1


def _jsonl_rows(path: Path, fmt: str, column: str, column_b: str | None,
                report: InputReport) -> Iterator[TextRecord]:
    with path.open("rb") as handle:
        for index, raw in enumerate(handle):
            line = _decoded(raw.rstrip(b"\r\n"), index, report)
            if not line.strip():
                report.count("empty", index)
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                report.count("bad_record", index)
                continue
            a = record.get(column) if isinstance(record, dict) else None
            b = record.get(column_b) if isinstance(record, dict) and column_b else None
            if not isinstance(a, str) or (column_b and not isinstance(b, str)):
                report.count("bad_record", index)
                continue
            yield TextRecord(index, a, b)
