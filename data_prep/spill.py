"""Tokenized documents spilled to disk by bucket, so that the job's memory does not grow with the corpus.

A runner's GroupByKey holds what it groups: on the DirectRunner, in the memory of one process. Grouping the
documents themselves made that process grow with the corpus (1.07 GB at 250 MB of text, 3.78 GB at 1 GB). So each
input file's reader writes its tokenized documents to one spill file under the output directory, in blocks of one
bucket each, and the graph groups only block references: (bucket, (file, offset, length)), a few per file and
bucket. A shard's writer then reads its bucket's blocks, one bucket at a time. The spill directory lies under the
output directory, on the same filesystem every worker writes shards to (gs:// on Dataflow), and is removed once the
job has ended: finished, failed or cancelled, never while it may still run (data_prep.spill_owner).

Block format: per document, a header of three little-endian uint32 (key bytes, ids, sentence ends), the key in
UTF-8, the ids in the shard set's token dtype, the sentence ends as int64.
"""
from __future__ import annotations

import hashlib
import os
import struct
import uuid
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from data_prep.instances import TokenizedDocument

SPILL_DIR = "_spill"
FLUSH_BYTES = 32 << 20    # buffered document bytes per input file before its blocks go to disk
_HEADER = struct.Struct("<III")
_ENDS_DTYPE = np.dtype("<i8")


class BlockRef(NamedTuple):
    """Where one bucket's documents from one input file lie: a byte range of a spill file."""

    path: str
    offset: int
    length: int


def spill_dir(output_dir: str) -> str:
    return FileSystems.join(output_dir, SPILL_DIR)


def spill_path(output_dir: str, input_path: str) -> str:
    """One spill file per input file, named by the input's path: a retried bundle rewrites the same file."""
    return FileSystems.join(spill_dir(output_dir), hashlib.sha256(input_path.encode()).hexdigest()[:32] + ".docs")


class SpillWriter:
    """Writes one input file's documents to its spill file, grouped into blocks by bucket.

    Documents are buffered per bucket and written as one block per bucket whenever the buffers reach
    FLUSH_BYTES, so memory stays bounded however large the input file is (a whole MediaWiki dump)."""

    def __init__(self, path: str, token_dtype: np.dtype):
        self.path = path
        self.token_dtype = np.dtype(token_dtype).newbyteorder("<")
        self._temporary = f"{path}.{uuid.uuid4().hex}.tmp"
        self._handle = None
        self._offset = 0
        self._buffers: dict[int, list[bytes]] = {}
        self._buffered = 0
        self.blocks: list[tuple[int, BlockRef]] = []

    def add(self, bucket: int, document: TokenizedDocument) -> None:
        key = document.key.encode("utf-8")
        ids = document.token_ids.astype(self.token_dtype).tobytes()
        ends = document.sentence_ends.astype(_ENDS_DTYPE).tobytes()
        record = b"".join((_HEADER.pack(len(key), len(document.token_ids), len(document.sentence_ends)),
                           key, ids, ends))
        self._buffers.setdefault(bucket, []).append(record)
        self._buffered += len(record)
        if self._buffered >= FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._handle is None:
            self._handle = FileSystems.create(self._temporary)
        for bucket in sorted(self._buffers):
            block = b"".join(self._buffers[bucket])
            self._handle.write(block)
            self.blocks.append((bucket, BlockRef(self.path, self._offset, len(block))))
            self._offset += len(block)
        self._buffers.clear()
        self._buffered = 0

    def close(self) -> list[tuple[int, BlockRef]]:
        """Writes what is buffered and puts the file in place; returns every (bucket, block) written."""
        if self._buffers:
            self._flush()
        if self._handle is not None:
            self._handle.close()
            if FileSystems.exists(self.path):
                FileSystems.delete([self.path])
            FileSystems.rename([self._temporary], [self.path])
        return self.blocks


def read_blocks(blocks: list[BlockRef], token_dtype: np.dtype) -> Iterator[TokenizedDocument]:
    """The documents of the given blocks, read one block at a time, each file opened once."""
    token_dtype = np.dtype(token_dtype).newbyteorder("<")
    by_file: dict[str, list[BlockRef]] = {}
    for block in blocks:
        by_file.setdefault(block.path, []).append(block)
    for path in sorted(by_file):
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            for block in sorted(by_file[path], key=lambda b: b.offset):
                handle.seek(block.offset)
                data = handle.read(block.length)
                if len(data) != block.length:
                    raise OSError(f"{path}: {len(data)} bytes at offset {block.offset}, expected {block.length}")
                yield from _decode_block(data, token_dtype)


def _decode_block(data: bytes, token_dtype: np.dtype) -> Iterator[TokenizedDocument]:
    position = 0
    while position < len(data):
        key_length, num_ids, num_ends = _HEADER.unpack_from(data, position)
        position += _HEADER.size
        key = data[position:position + key_length].decode("utf-8")
        position += key_length
        ids = np.frombuffer(data, dtype=token_dtype, count=num_ids, offset=position).astype(np.int32)
        position += num_ids * token_dtype.itemsize
        ends = np.frombuffer(data, dtype=_ENDS_DTYPE, count=num_ends, offset=position).astype(np.int64)
        position += num_ends * _ENDS_DTYPE.itemsize
        yield TokenizedDocument(key, ids, ends)


def remove_spill(output_dir: str) -> None:
    """Deletes the spill directory; data_prep.spill_owner says when."""
    directory = spill_dir(output_dir)
    files = [m.path for m in FileSystems.match([FileSystems.join(directory, "*")])[0].metadata_list]
    if files:
        FileSystems.delete(files)
    if "://" not in directory and os.path.isdir(directory):   # object stores have no directories to remove
        os.rmdir(directory)
