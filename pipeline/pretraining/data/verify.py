"""Check a shard set against its manifest (every file's size and sha256) before training reads it.

    python -m pipeline.pretraining.data.verify <shard set directory>

A corrupt shard otherwise surfaces as a decompression error wherever its row group happens to come in the
epoch, possibly hours into a run; hashing the set first costs seconds per GB (see README) and names the files.

A run keeps a record of what it verified (`record`: <output_dir>/verified_shards.json, each file's identity and the
sha256 it matched), so its later starts (a SLURM requeue, a resume) hash only the files that changed since, instead of
the whole set on rank 0 while the other ranks wait. A local file counts as unchanged while its inode, size, mtime and
ctime are: `cp -p`, `rsync -a` or `touch -r` can put back a size and an mtime, but a write, a replacement or a utime
call gives a new ctime (or inode), which only the kernel sets. On a remote filesystem (gs://, s3://) the size and the
time the store itself records for the object's last write count. Not the device number: it differs from node to node
for the same NFS or Lustre file, so a requeue on another node would hash the whole set again. Training's
`data.verify_checksums=full` (this command always) hashes every file whatever the record says.

Training hashes on every node (pipeline/pretraining/checks.py): a copy staged to a node's local disk is that node's
alone. The record keeps every identity a file was verified under, one per node-local copy (on a shared filesystem
they are one): each node adds its own to what the file holds when it writes. Two nodes writing at once may lose one's
additions, which only costs that node a hash at its next start.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from data_prep.layout import set_file
from data_prep.manifest import read_manifest, shard_file_entries, verify_files
from pipeline.core.checkpoints.atomic_files import write_atomically
from pipeline.core.file_stamp import file_stamp

RECORD_NAME = "verified_shards.json"
MODES = {True: "changed", False: None, "full": "full"}   # data.verify_checksums: what a start hashes
_MOST_COPIES = 1024    # identities kept per file: one per node-local copy, bounded


@dataclasses.dataclass(frozen=True)
class Verification:
    bad_files: list[str]     # names (relative to the set) whose size or sha256 differs from the manifest
    files: int
    bytes: int
    seconds: float
    threads: int
    hashed_files: int = 0    # files read and hashed now (the others: unchanged since a recorded check)
    hashed_bytes: int = 0

    @property
    def seconds_per_gb(self) -> float:
        return self.seconds / max(self.hashed_bytes / 1e9, 1e-9)

    def describe(self) -> str:
        unchanged = self.files - self.hashed_files
        skipped = f"; {unchanged} unchanged since their recorded check (inode, size, mtime, ctime)" if unchanged else ""
        return (f"{self.files} files, {self.bytes / 1e9:.3f} GB: {self.hashed_files} hashed "
                f"({self.hashed_bytes / 1e9:.3f} GB) against the manifest's sizes and sha256 in {self.seconds:.2f} s "
                f"({self.seconds_per_gb:.2f} s per GB, {self.threads} threads){skipped}")


def checksum_mode(value: Any) -> str | None:
    """data.verify_checksums: true ("changed": what the run's record does not vouch for), full, or false (None)."""
    for known, mode in MODES.items():
        if value is known or (isinstance(value, str) and value.lower() == str(known).lower()):
            return mode
    raise ValueError(f"data.verify_checksums={value!r}: use true (hash the shards that changed since this run "
                     "verified them), full (hash every shard) or false (hash none)")


def verify_shard_set(path: str, manifest: dict[str, Any] | None = None, threads: int | None = None,
                     record: Path | None = None, full: bool = False) -> Verification:
    """Hash the set's files against the manifest; with `record`, only those not recorded there as verified as they
    are now (unless `full`), and record the ones that pass."""
    manifest = manifest or read_manifest(path)
    entries = shard_file_entries(manifest)
    threads = threads or min(8, os.cpu_count() or 1, max(len(entries), 1))
    recorded = {} if full else _read_record(record)
    stats = {entry["path"]: _stat(path, entry["path"]) for entry in entries}
    to_hash = [entry for entry in entries
               if _verified(entry, stats[entry["path"]]) not in recorded.get(_key(path, entry), [])]
    started = time.perf_counter()
    bad = verify_files(path, to_hash, threads=threads)
    seconds = time.perf_counter() - started
    if record is not None:
        # The files that passed now or before, as they were when hashed (stat read before hashing: a file rewritten
        # meanwhile has another ctime at the next start, and is hashed again then), beside the identities other
        # nodes' copies were verified under (read again now: they may have written since)
        written = _read_record(record)
        verified = {}
        for entry in entries:
            key, now = _key(path, entry), _verified(entry, stats[entry["path"]])
            others = [v for v in written.get(key, []) if v != now and v.get("sha256") == entry["sha256"]]
            verified[key] = (others + ([now] if entry["path"] not in bad and now is not None else []))[-_MOST_COPIES:]
        write_atomically(record, json.dumps({k: v for k, v in verified.items() if v}, indent=1, sort_keys=True))
    return Verification(bad, len(entries), sum(int(e["bytes"]) for e in entries), seconds, threads,
                        len(to_hash), sum(int(e["bytes"]) for e in to_hash))


def _key(shard_dir: str, entry: dict[str, Any]) -> str:
    joined = set_file(shard_dir, entry["path"])
    return joined if "://" in shard_dir else str(Path(joined).resolve())


def _verified(entry: dict[str, Any], stat: dict[str, int] | None) -> dict[str, Any] | None:
    if stat is None:
        return None
    return {**stat, "sha256": entry["sha256"]}


def _stat(shard_dir: str, name: str) -> dict[str, int] | None:
    """What identifies a shard file's content short of reading it (see the module docstring), local or on any Beam
    filesystem; None when it cannot be read."""
    try:
        path = set_file(shard_dir, name)
        if "://" not in shard_dir:
            return file_stamp(path)
        from apache_beam.io.filesystems import FileSystems

        metadata = FileSystems.match([path])[0].metadata_list[0]
        return {"size": int(metadata.size_in_bytes), "mtime_ns": int(metadata.last_updated_in_seconds * 1e9)}
    except Exception:   # noqa: BLE001 - any filesystem's error: hash the file instead, which reports it
        return None


def _read_record(record: Path | None) -> dict[str, Any]:
    if record is None or not Path(record).is_file():
        return {}
    try:
        loaded = json.loads(Path(record).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}          # unreadable: verify everything again, and write it anew
    if not isinstance(loaded, dict):
        return {}
    # key -> the identities it was verified under (a record of an earlier version: one)
    return {key: [value] if isinstance(value, dict) else [v for v in value if isinstance(v, dict)]
            for key, value in loaded.items() if isinstance(value, (dict, list))}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    result = verify_shard_set(args[0])
    print(f"{args[0]}: {result.describe()}")
    if result.bad_files:
        print(f"differ from the manifest (corrupt or rewritten): {', '.join(result.bad_files)}", file=sys.stderr)
        return 1
    print("all files intact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
