"""Shard rows as numpy arrays, read from Parquet one row group at a time.

A list column (input_ids, masked_lm_positions, masked_lm_ids, document_starts) is kept as Arrow stores it, one flat
array of values, plus each row's start and length in it. Shuffling and batching then select rows by moving only the
per-row arrays; the tokens are touched when the collator gathers a batch into its padded arrays (and,
for dynamic sets, when runs of rows are masked).
"""
from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.pretraining.data.epoch_plan import Piece
from pipeline.pretraining.data.shard_set import ShardSet, filesystem_and_path


@dataclasses.dataclass
class Rows:
    token_values: np.ndarray       # input_ids of all rows, back to back (int16 or int32, as stored)
    token_starts: np.ndarray       # (n,) int64: where each row's input_ids start in token_values
    num_tokens: np.ndarray         # (n,) int64
    num_tokens_a: np.ndarray       # (n,) int64
    next_sentence_label: np.ndarray  # (n,) int8
    row_index: np.ndarray          # (n,) int64: the row's global index in the set
    # The masking, where rows carry it (static sets, and dynamic rows once the collator's mask_rows has masked
    # them); None otherwise. masked_lm_positions and masked_lm_ids have equal lengths per row, so they share
    # starts and lengths.
    masked_positions: np.ndarray | None = None
    masked_ids: np.ndarray | None = None
    masked_starts: np.ndarray | None = None
    num_masked: np.ndarray | None = None
    # Where each row's packed documents start (positions in the row, ascending, the first 0), where the set records
    # them (MLM-only rows, manifest format 3 on); None otherwise.
    document_start_values: np.ndarray | None = None
    document_start_offsets: np.ndarray | None = None   # (n,) int64: where each row's starts begin in the values
    num_documents: np.ndarray | None = None            # (n,) int64

    def __len__(self) -> int:
        return len(self.num_tokens)

    @property
    def is_masked(self) -> bool:
        """True when the rows carry their masking (and token_values are the masked ids)."""
        return self.masked_positions is not None

    @property
    def has_documents(self) -> bool:
        """True when the rows carry their document starts."""
        return self.document_start_values is not None

    def take(self, indices: np.ndarray) -> Rows:
        """These rows, in this order; shares the flat value arrays."""
        masked, documents = self.is_masked, self.has_documents
        return Rows(self.token_values, self.token_starts[indices], self.num_tokens[indices],
                    self.num_tokens_a[indices], self.next_sentence_label[indices], self.row_index[indices],
                    self.masked_positions, self.masked_ids,
                    self.masked_starts[indices] if masked else None, self.num_masked[indices] if masked else None,
                    self.document_start_values, self.document_start_offsets[indices] if documents else None,
                    self.num_documents[indices] if documents else None)

    def compact(self) -> Rows:
        """A copy holding only these rows' values (for the few rows carried from one run to the next)."""
        values, starts = gather_lists(self.token_values, self.token_starts, self.num_tokens)
        rows = dataclasses.replace(self, token_values=values, token_starts=starts)
        if self.is_masked:
            rows.masked_positions, _ = gather_lists(self.masked_positions, self.masked_starts, self.num_masked)
            rows.masked_ids, rows.masked_starts = gather_lists(self.masked_ids, self.masked_starts, self.num_masked)
        if self.has_documents:
            rows.document_start_values, rows.document_start_offsets = gather_lists(
                self.document_start_values, self.document_start_offsets, self.num_documents)
        return rows


def gather_lists(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows' lists back to back (values[starts[i]:starts[i] + lengths[i]] for each i), and their new starts."""
    new_starts = np.cumsum(lengths) - lengths
    flat = np.repeat(starts - new_starts, lengths) + np.arange(int(lengths.sum()))
    return values[flat], new_starts


def concat(parts: list[Rows]) -> Rows:
    """The rows of all parts, in order; value arrays are concatenated whole (compact() small parts first)."""
    if len(parts) == 1:
        return parts[0]

    def lists(values_of, starts_of):
        shifts = np.cumsum([0] + [len(values_of(p)) for p in parts[:-1]])
        return (np.concatenate([values_of(p) for p in parts]),
                np.concatenate([starts_of(p) + shift for p, shift in zip(parts, shifts)]))

    def rows(field):
        return np.concatenate([getattr(p, field) for p in parts])

    token_values, token_starts = lists(lambda p: p.token_values, lambda p: p.token_starts)
    joined = Rows(token_values, token_starts, rows("num_tokens"), rows("num_tokens_a"),
                  rows("next_sentence_label"), rows("row_index"))
    if parts[0].is_masked:
        joined.masked_positions, joined.masked_starts = lists(lambda p: p.masked_positions, lambda p: p.masked_starts)
        joined.masked_ids, _ = lists(lambda p: p.masked_ids, lambda p: p.masked_starts)
        joined.num_masked = rows("num_masked")
    if parts[0].has_documents:
        joined.document_start_values, joined.document_start_offsets = lists(
            lambda p: p.document_start_values, lambda p: p.document_start_offsets)
        joined.num_documents = rows("num_documents")
    return joined


class ShardReadError(RuntimeError):
    """A row group that cannot be read (a corrupt or replaced shard), named so that the user can act on it."""


def _read_error(shard_set: ShardSet, file_index: int, group_index: int, error: Exception) -> ShardReadError:
    return ShardReadError(
        f"cannot read row group {group_index} of shard {shard_set.shards[file_index].path} (shard set "
        f"{shard_set.path}): {type(error).__name__}: {error}. The file is corrupt or was changed after data_prep "
        "wrote it. Check the whole set against its manifest with "
        f"`python -m pipeline.pretraining.data.verify {shard_set.path}` "
        "(training does this at start-up unless data.verify_checksums=false), then restore the file from a copy "
        "or re-run data_prep for this set.")


class RowGroupReader:
    """Reads pieces of a shard set's row groups into Rows; keeps a few files open, since a worker reads many
    groups of the same files in an epoch and opening one re-reads its footer."""

    def __init__(self, shard_set: ShardSet, max_open_files: int = 8):
        self.shard_set = shard_set
        self.columns = list(shard_set.columns)
        self.max_open_files = max_open_files
        self._open: collections.OrderedDict[int, pq.ParquetFile] = collections.OrderedDict()

    def _file(self, file_index: int) -> pq.ParquetFile:
        if file_index in self._open:
            self._open.move_to_end(file_index)
            return self._open[file_index]
        filesystem, path = filesystem_and_path(self.shard_set.shards[file_index].path)
        handle = pq.ParquetFile(filesystem.open_input_file(path))
        self._open[file_index] = handle
        if len(self._open) > self.max_open_files:
            self._open.popitem(last=False)[1].close()
        return handle

    def read(self, pieces: list[Piece]) -> Rows:
        return concat([self.read_piece(piece) for piece in pieces])

    def read_piece(self, piece: Piece) -> Rows:
        groups = self.shard_set.row_groups
        file_index, group_index = int(groups.file[piece.group]), int(groups.index[piece.group])
        try:
            # use_threads=False: a loader worker is one core's worth of work; parallelism comes from more workers.
            table = self._file(file_index).read_row_group(group_index, columns=self.columns, use_threads=False)
        except (OSError, pa.ArrowException) as error:
            raise _read_error(self.shard_set, file_index, group_index, error) from error
        first_row = int(groups.first_row[piece.group])
        rows = slice(piece.start, piece.stop)
        token_values, token_offsets = _list_column(table.column("input_ids"))
        num_tokens = np.diff(token_offsets)[rows]
        if self.shard_set.has_next_sentence_labels:
            num_tokens_a = _column(table, "num_tokens_a")[rows].astype(np.int64)
            next_sentence_label = _column(table, "next_sentence_label")[rows]
        else:   # MLM-only rows are one segment ([CLS] text [SEP]); their label is never read
            num_tokens_a, next_sentence_label = num_tokens - 2, np.zeros(len(num_tokens), dtype=np.int8)
        result = Rows(
            token_values=token_values,
            token_starts=token_offsets[:-1][rows],
            num_tokens=num_tokens,
            num_tokens_a=num_tokens_a,
            next_sentence_label=next_sentence_label,
            row_index=np.arange(first_row + piece.start, first_row + piece.stop, dtype=np.int64),
        )
        if self.shard_set.has_document_boundaries:
            result.document_start_values, offsets = _list_column(table.column("document_starts"))
            result.document_start_offsets = offsets[:-1][rows]
            result.num_documents = np.diff(offsets)[rows]
        if self.shard_set.masking == "static":
            result.masked_positions, offsets = _list_column(table.column("masked_lm_positions"))
            result.masked_ids, id_offsets = _list_column(table.column("masked_lm_ids"))
            if not np.array_equal(offsets, id_offsets):
                raise ValueError(f"{self.shard_set.shards[int(groups.file[piece.group])].path}: masked_lm_positions "
                                 "and masked_lm_ids differ in length in some row")
            result.masked_starts = offsets[:-1][rows]
            result.num_masked = np.diff(offsets)[rows]
        return result

    def close(self) -> None:
        for handle in self._open.values():
            handle.close()
        self._open.clear()


def _list_column(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Flat values and int64 offsets (n + 1, from 0) of a list column without nulls."""
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    offsets = array.offsets.to_numpy().astype(np.int64)
    values = array.values.to_numpy()
    if offsets[0] != 0:   # a sliced array: its offsets point into the whole child array
        values, offsets = values[offsets[0]:offsets[-1]], offsets - offsets[0]
    return values, offsets


def _column(table: pa.Table, name: str) -> np.ndarray:
    column = table.column(name)
    return (column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)).to_numpy()
