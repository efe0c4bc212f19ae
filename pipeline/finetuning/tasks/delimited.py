"""Reading a task's delimited file (GLUE's TSVs, CoLA's raw release, STS-B's original csv, SWAG's csv) into the
columns of :mod:`pipeline.finetuning.tasks.schema`.

Two steps, both cached by ``datasets`` under ``cache_dir``: ``load_dataset("csv", ...)`` reads every column as a
string (no NaN conversion: "null", "NA" and "nan" are real words in these corpora), then ``Dataset.map`` checks each
row and normalises it.  Bad input stops the read with a ``ValueError`` naming the file, the line and the row.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

import datasets
from datasets.exceptions import DatasetGenerationError

from pipeline.finetuning.fingerprint import code_digest
from pipeline.finetuning.tasks import schema
from pipeline.finetuning.tasks.files import RecordLines, first_long_record, first_records, not_utf8_error, preview
from pipeline.finetuning.tasks.layouts import FileLayout, TaskFormat

_INTEGER = re.compile(r"-?\d+")

# The cached normalised rows must not outlive a change to how rows are normalised: the map's fingerprint
# includes a digest of the code that does it (datasets hashes an object's state, not its class's code).
_CODE_DIGEST = code_digest(__file__, schema.__file__)

FIX_ADVICE = "Fix or remove that row."


def read_delimited(task: TaskFormat, split: str, path: Path, cache_dir: str | None) -> datasets.Dataset:
    """The rows of one file of ``task`` as the columns of :mod:`pipeline.finetuning.tasks.schema`."""
    where = f"{task.name} {split}: {path}"
    layout, names = choose_layout(task, path, where)
    labelled = layout.label is not None and layout.label in names
    if not labelled and split not in task.test_splits:
        raise ValueError(f"{where}: no {layout.label!r} column (columns: {', '.join(names)}); the {split} split "
                         f"needs labels (only {', '.join(task.test_splits)} may come without)")
    raw = _load_strings(path, layout, names, cache_dir, where)
    normalise = _RowNormaliser(task, layout, names, labelled, path, where)
    return raw.map(normalise, batched=True, with_indices=True, remove_columns=raw.column_names,
                   features=schema.features(task.kind), desc=f"{task.name} {split}")


def choose_layout(task: TaskFormat, path: Path, where: str) -> tuple[FileLayout, tuple[str, ...]]:
    """The first of the task's layouts that fits the file's first line, and the file's column names.

    Also catches, before pandas can hide them, an empty split and a first row with more fields than the header.
    """
    tried = []
    for layout in task.layouts:
        records = first_records(path, layout.delimiter, layout.quoted)
        if not records:
            raise ValueError(f"{where}: the file is empty (an empty {task.name} split)")
        line, first = records[0]
        if layout.has_header:
            header = tuple(field.strip() for field in first)
            if not all(column in header for column in layout.text_columns()):
                tried.append(", ".join(layout.text_columns()))
                continue
            duplicates = sorted({c for c in header if header.count(c) > 1})
            if duplicates:
                raise ValueError(f"{where}, line {line}: the header names {duplicates} more than once")
            if len(records) < 2:
                raise ValueError(f"{where}: a header and no rows (an empty {task.name} split)")
            row_line, row = records[1]
            _check_field_count(row, len(header), where, row_line, layout)
            return layout, header
        _check_field_count(first, len(layout.names), where, line, layout)
        return layout, layout.names
    raise ValueError(f"{where}, line {line}: expected a header naming the columns {' or '.join(tried)}; found "
                     f"{preview(first, task.layouts[0].delimiter)}. Is this a {task.name} file?")


def _check_field_count(fields: list[str], most: int, where: str, line: int, layout: FileLayout) -> None:
    if len(fields) > most:
        raise ValueError(f"{where}, line {line}: {len(fields)} fields, more than the {most} columns of the file: "
                         f"{preview(fields, layout.delimiter)}. {FIX_ADVICE}")


def _load_strings(path: Path, layout: FileLayout, names: tuple[str, ...], cache_dir: str | None, where: str
                  ) -> datasets.Dataset:
    """Every column as a string: a missing trailing field comes back as "" (pandas' C parser fills it so)."""
    try:
        return datasets.load_dataset(
            "csv", data_files={"train": str(path)}, split="train", cache_dir=cache_dir,
            delimiter=layout.delimiter, quoting=csv.QUOTE_MINIMAL if layout.quoted else csv.QUOTE_NONE,
            header=0 if layout.has_header else None, column_names=list(names),
            index_col=False,         # never take a first column as the index (pandas guesses so on long rows)
            keep_default_na=False,   # "NA", "null", "nan", "" stay text
            features=datasets.Features({name: datasets.Value("string") for name in names}),
        )
    except DatasetGenerationError as error:
        raise _explain_parse_error(error, path, layout, len(names), where) from error


def _explain_parse_error(error: Exception, path: Path, layout: FileLayout, columns: int, where: str) -> ValueError:
    """pandas' parse errors, said with the file's line."""
    cause = error
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, UnicodeDecodeError):
        return not_utf8_error(path)
    long_row = first_long_record(path, layout.delimiter, layout.quoted, layout.has_header, columns)
    if long_row:
        return ValueError(f"{where}, line {long_row[0]}: {len(long_row[1])} fields, more than the {columns} columns "
                          f"of the file: {preview(long_row[1], layout.delimiter)}. {FIX_ADVICE}")
    return ValueError(f"{where}: cannot be read as a {'comma' if layout.delimiter == ',' else 'tab'}-separated "
                      f"file: {type(cause).__name__}: {cause}")


class _RowNormaliser:
    """The ``Dataset.map`` function: check each row, turn it into the output columns.

    A "" in a needed column is either an empty field or a missing one (a short row); only then is the file's line
    looked up (:class:`RecordLines`) to tell which.  An empty text is kept; an empty label or index is bad.
    """

    def __init__(self, task: TaskFormat, layout: FileLayout, names: tuple[str, ...], labelled: bool, path: Path,
                 where: str):
        self.kind = task.kind
        self.task_name = task.name
        self.label_ids = None if task.file_labels is None else {v: i for i, v in enumerate(task.file_labels)}
        self.names = names
        self.text_columns = [layout.text_a, layout.text_b]
        self.endings = list(layout.endings)
        self.label = layout.label if labelled else None
        self.index = layout.index if layout.index in names else None
        self.delimiter = layout.delimiter
        self.where = where
        self.code = _CODE_DIGEST
        self.lines = RecordLines(path, layout.delimiter, layout.quoted, layout.has_header)

    def __call__(self, batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        out = schema.empty_columns(self.kind)
        for i, row in enumerate(indices):
            texts = [None if c is None else self._value(batch, c, i, row) for c in self.text_columns]
            endings = [self._value(batch, c, i, row) for c in self.endings]
            idx = row if self.index is None else self._index(self._value(batch, self.index, i, row), row)
            if self.label is None:
                label = schema.NO_SCORE if self.kind == "regression" else schema.NO_LABEL
            else:
                label = self._label(self._value(batch, self.label, i, row), row)
            schema.append_row(out, self.kind, idx, texts, endings, label)
        return out

    def _value(self, batch: dict[str, list], column: str, i: int, row: int) -> str:
        value = batch[column][i]
        if not value:
            line, fields = self.lines.locate(row)
            if value is None or fields <= self.names.index(column):
                self._fail(row, f"column {column!r} is missing (the row has {fields} of the file's "
                                f"{len(self.names)} fields)")
        return value

    def _index(self, value: str, row: int) -> int:
        if not _INTEGER.fullmatch(value.strip()):
            self._fail(row, f"index {value!r} in column {self.index!r} is not an integer")
        return int(value)

    def _label(self, value: str, row: int):
        text = value.strip()
        if self.label_ids is not None:
            if text not in self.label_ids:
                self._fail(row, f"label {value!r} in column {self.label!r} is not one of {self.task_name}'s labels "
                                f"{tuple(self.label_ids)}")
            return self.label_ids[text]
        try:
            score = float(text)
        except ValueError:
            score = None
        low, high = schema.STSB_SCORE_RANGE
        if score is None or not low <= score <= high:
            self._fail(row, f"score {value!r} in column {self.label!r} is not a number in [{low:g}, {high:g}]")
        return score

    def _fail(self, row: int, problem: str):
        line, _ = self.lines.locate(row)
        fields = self.lines.fields_at(line)
        raise ValueError(f"{self.where}, line {line}: {problem}: {preview(fields, self.delimiter)}. {FIX_ADVICE}")
