"""Extracted features to files, one sentence at a time (nothing is held beyond a row group).

    parquet  features.parquet: line_index, text_a, text_b, and per view `cls_<view>` / `mean_<view>` (C floats),
             plus, with per-token output, `tokens` (the WordPieces) and `tokens_<view>` (T x C floats)
    numpy    a directory: line_index.npy (N,), cls_<view>.npy / mean_<view>.npy (N, C); with per-token output
             tokens_<view>.npy (all tokens, C), token_offsets.npy (N + 1,): sentence i is rows
             [offsets[i], offsets[i+1]), and tokens.txt (one WordPiece per line)
    jsonl    google-research/bert extract_features.py's layout, one line per sentence:
             {"linex_index": i, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]}]}]}
             ("linex_index" is the reference's spelling; values rounded to 6 decimals as it does). Per-token
             layers only: that layout has no place for pooled vectors or combinations.

`read_reference_jsonl` reads that layout back (the test checks the round trip).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pipeline.extraction.extractor import SentenceFeatures

FORMATS = ("parquet", "numpy", "jsonl")


def open_writer(fmt: str, path: Path, views: list[str], poolings, per_token: bool):
    if fmt == "parquet":
        return ParquetFeatureWriter(path, views, poolings, per_token)
    if fmt == "numpy":
        return NumpyFeatureWriter(path, views, poolings, per_token)
    if fmt == "jsonl":
        return ReferenceJsonlWriter(path, views)
    raise ValueError(f"unknown output format {fmt!r}; known: {', '.join(FORMATS)}")


class ParquetFeatureWriter:
    ROWS_PER_GROUP = 1024

    def __init__(self, path: Path, views: list[str], poolings, per_token: bool):
        self.path, self.views, self.poolings, self.per_token = Path(path), views, list(poolings), per_token
        self.buffer: list[SentenceFeatures] = []
        self.writer = None
        self.rows = 0

    def write(self, sentence: SentenceFeatures, tokens: list[str] | None = None) -> None:
        self.buffer.append((sentence, tokens))
        if len(self.buffer) >= self.ROWS_PER_GROUP:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.buffer:
            return
        sentences = [s for s, _ in self.buffer]
        columns = {"line_index": pa.array([s.line_index for s in sentences], pa.int64()),
                   "text_a": pa.array([s.text_a for s in sentences], pa.string()),
                   "text_b": pa.array([s.text_b for s in sentences], pa.string())}
        for pooling in self.poolings:
            for view in self.views:
                columns[f"{pooling}_{view}"] = _fixed_rows(np.stack([s.pooled[pooling][view] for s in sentences]))
        if self.per_token:
            columns["tokens"] = pa.array([t for _, t in self.buffer], pa.list_(pa.string()))
            for view in self.views:
                vectors = [s.per_token[view] for s in sentences]
                offsets = np.concatenate([[0], np.cumsum([len(v) for v in vectors])]).astype(np.int32)
                columns[f"tokens_{view}"] = pa.ListArray.from_arrays(pa.array(offsets),
                                                                     _fixed_rows(np.concatenate(vectors)))
        table = pa.table(columns)
        if self.writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(self.path, table.schema)
        self.writer.write_table(table)
        self.rows += len(sentences)
        self.buffer = []

    def close(self) -> Path:
        self._flush()
        if self.writer is None:   # no input sentence: an empty file with the columns' names still
            import pyarrow as pa
            import pyarrow.parquet as pq
            pq.write_table(pa.table({"line_index": pa.array([], pa.int64())}), self.path)
        else:
            self.writer.close()
        return self.path


def _fixed_rows(matrix: np.ndarray):
    """(N, C) float32 -> an Arrow array of N fixed-size lists of C floats (no copy of the values)."""
    import pyarrow as pa

    matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])


class _GrowingNpy:
    """A .npy file written row block by row block: the header's shape is rewritten on close. The header is a fixed
    128 bytes, so rewriting it never moves the data."""
    HEADER_BYTES = 128

    def __init__(self, path: Path, dtype: np.dtype, row_shape: tuple[int, ...]):
        self.path, self.dtype, self.row_shape, self.rows = path, np.dtype(dtype), row_shape, 0
        self.handle = path.open("wb")
        self.handle.write(self._header())

    def _header(self) -> bytes:
        shape = (self.rows, *self.row_shape)
        text = f"{{'descr': {self.dtype.str!r}, 'fortran_order': False, 'shape': {shape!r}, }}".encode("latin1")
        prefix = b"\x93NUMPY\x01\x00"
        padding = self.HEADER_BYTES - len(prefix) - 2 - len(text) - 1
        return prefix + (self.HEADER_BYTES - len(prefix) - 2).to_bytes(2, "little") + text + b" " * padding + b"\n"

    def append(self, block: np.ndarray) -> None:
        block = np.ascontiguousarray(block, dtype=self.dtype)
        self.handle.write(block.tobytes())
        self.rows += len(block)

    def close(self) -> None:
        self.handle.seek(0)
        self.handle.write(self._header())
        self.handle.close()


class NumpyFeatureWriter:
    def __init__(self, path: Path, views: list[str], poolings, per_token: bool):
        self.directory = Path(path)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.views, self.poolings, self.per_token = views, list(poolings), per_token
        self.files: dict[str, _GrowingNpy] = {}
        self.tokens_file = (self.directory / "tokens.txt").open("w", encoding="utf-8") if per_token else None
        self.total_tokens = 0

    def _file(self, name: str, dtype, row_shape: tuple[int, ...]) -> _GrowingNpy:
        if name not in self.files:
            self.files[name] = _GrowingNpy(self.directory / f"{name}.npy", dtype, row_shape)
        return self.files[name]

    def write(self, sentence: SentenceFeatures, tokens: list[str] | None = None) -> None:
        self._file("line_index", np.int64, ()).append(np.array([sentence.line_index]))
        for pooling in self.poolings:
            for view in self.views:
                vector = sentence.pooled[pooling][view]
                self._file(f"{pooling}_{view}", np.float32, vector.shape).append(vector[None])
        if self.per_token:
            offsets = self._file("token_offsets", np.int64, ())
            if offsets.rows == 0:
                offsets.append(np.array([0]))
            for view in self.views:
                vectors = sentence.per_token[view]
                self._file(f"tokens_{view}", np.float32, vectors.shape[1:]).append(vectors)
            self.total_tokens += len(tokens)
            offsets.append(np.array([self.total_tokens]))
            self.tokens_file.write("".join(f"{token}\n" for token in tokens))

    def close(self) -> Path:
        for npy in self.files.values():
            npy.close()
        if self.tokens_file is not None:
            self.tokens_file.close()
        return self.directory


class ReferenceJsonlWriter:
    def __init__(self, path: Path, views: list[str]):
        not_layers = [v for v in views if not v.startswith("layer_")]
        if not_layers:
            raise ValueError(f"the reference's JSONL layout holds single layers only (by index); {not_layers} "
                             "need output_format=parquet or numpy")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = self.path.open("w", encoding="utf-8")
        self.layers = [(view, int(view.removeprefix("layer_"))) for view in views]

    def write(self, sentence: SentenceFeatures, tokens: list[str] | None = None) -> None:
        if sentence.per_token is None:
            raise ValueError("the reference's JSONL layout is per token: extract with per_token=true")
        features = []
        for position, token in enumerate(tokens):
            layers = [{"index": index, "values": [round(float(x), 6) for x in sentence.per_token[view][position]]}
                      for view, index in self.layers]
            features.append({"token": token, "layers": layers})
        self.handle.write(json.dumps({"linex_index": sentence.line_index, "features": features}) + "\n")

    def close(self) -> Path:
        self.handle.close()
        return self.path


def read_reference_jsonl(path: str | Path) -> Iterator[dict]:
    """The reference layout back: {"line_index", "tokens", "layers": {index: (T, C) float32}} per line."""
    with Path(path).open(encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            tokens = [feature["token"] for feature in record["features"]]
            indices = [layer["index"] for layer in record["features"][0]["layers"]] if tokens else []
            layers = {index: np.array([[v for v in feature["layers"][k]["values"]] for feature in record["features"]],
                                      dtype=np.float32)
                      for k, index in enumerate(indices)}
            yield {"line_index": record["linex_index"], "tokens": tokens, "layers": layers}
