"""manifest.json read: the contract between data_prep and training (data_prep.manifest_writer writes it).

A shard set is opened through its manifest, and its files are checked against the sizes and sha256 it records.
Training refuses a set whose parameters do not fit its config (pipeline/pretraining/data/shard_set.py).

A set on a local disk is read with the standard library alone; Apache Beam's FileSystems are imported only for one
elsewhere (gs://, s3://, hdfs://: where data_prep's Beam job writes). So training on a local copy of a set does not
need Beam: the lent GPU machine's image has none, and its import costs a process about 1.1 CPU-seconds here.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
from typing import IO, Any

from data_prep.layout import MANIFEST_NAME, set_file

_HASH_CHUNK_BYTES = 4 << 20


class UnreadableManifest(ValueError):
    """A manifest.json that is there but is not a whole manifest (cut off, or not JSON): the set cannot be used."""


def _is_remote(path: str) -> bool:
    return "://" in path


def _exists(path: str) -> bool:
    if not _is_remote(path):
        return os.path.exists(path)
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.exists(path)


def _open_bytes(path: str) -> IO[bytes]:
    """The file's bytes as stored (no decompression by its name's suffix)."""
    if not _is_remote(path):
        return open(path, "rb")
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def read_manifest(shard_dir: str) -> dict[str, Any]:
    path = set_file(shard_dir, MANIFEST_NAME)
    if not _exists(path):
        raise FileNotFoundError(f"no {MANIFEST_NAME} in {shard_dir}: not a shard set written by data_prep")
    with _open_bytes(path) as handle:
        data = handle.read()
    try:
        manifest = json.loads(data.decode("utf-8"))
    except ValueError as error:     # JSONDecodeError, UnicodeDecodeError
        manifest, why = None, f"{type(error).__name__}: {error}"
    else:
        why = f"JSON of type {type(manifest).__name__}, not an object"
    if not isinstance(manifest, dict):
        # A data prep killed while writing it (before manifests were written whole), a full disk, a partial copy.
        raise UnreadableManifest(
            f"{path} is not a whole manifest ({len(data)} bytes; {why}): the shard set in {shard_dir} cannot be "
            f"used as it is. Re-run data prep into it (python data_prep/run.py ... output_dir={shard_dir}) to write "
            "its shards and manifest again.")
    return manifest


def existing_manifest(shard_dir: str) -> dict[str, Any] | None:
    """The manifest of the shard set already in `shard_dir`; None when there is none (or it is not readable JSON:
    then nothing of it can be kept)."""
    try:
        return read_manifest(shard_dir)
    except (FileNotFoundError, OSError, ValueError):
        return None


def verify_checksums(shard_dir: str, manifest: dict[str, Any] | None = None, threads: int | None = None) -> list[str]:
    """Names of shard files whose size or sha256 differs from the manifest (empty when all are intact).

    Files are hashed in parallel threads (hashlib and file reads release the GIL), so a set is checked at the
    speed of its storage rather than of one core. A missing or unreadable file counts as differing.
    """
    return verify_files(shard_dir, shard_file_entries(manifest or read_manifest(shard_dir)), threads)


def shard_file_entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest's entry ({"path", "bytes", "sha256"}) of every shard file, Parquet and TFRecord."""
    return [shard[kind] for shard in manifest["shards"] for kind in ("parquet", "tfrecord") if kind in shard]


def verify_files(shard_dir: str, entries: list[dict[str, Any]], threads: int | None = None) -> list[str]:
    """verify_checksums for the given manifest entries only."""
    threads = threads or min(8, os.cpu_count() or 1, max(len(entries), 1))
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        intact = list(pool.map(lambda entry: _file_matches(shard_dir, entry), entries))
    return [entry["path"] for entry, ok in zip(entries, intact) if not ok]


def _file_matches(shard_dir: str, entry: dict[str, Any]) -> bool:
    path = set_file(shard_dir, entry["path"])
    digest, size = hashlib.sha256(), 0
    try:
        with _open_bytes(path) as handle:
            while chunk := handle.read(_HASH_CHUNK_BYTES):
                digest.update(chunk)
                size += len(chunk)
                if size > entry["bytes"]:
                    return False
    except OSError:   # missing or unreadable: not the file the manifest describes
        return False
    return size == entry["bytes"] and digest.hexdigest() == entry["sha256"]
