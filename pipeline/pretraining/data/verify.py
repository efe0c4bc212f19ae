"""Check a shard set against its manifest (every file's size and sha256) before training reads it.

    python -m pipeline.pretraining.data.verify <shard set directory>

A corrupt shard otherwise surfaces as a decompression error wherever its row group happens to come in the
epoch, possibly hours into a run; hashing the set first costs seconds per GB (see README) and names the files.

A run keeps a record of what it verified (`record`: <output_dir>/verified_shards.json, each file's size, mtime and
the sha256 it matched), so its later starts (a SLURM requeue, a resume) hash only the files whose size or mtime
changed since, instead of the whole set on rank 0 while the other ranks wait.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.core.atomic_files import write_atomically

RECORD_NAME = "verified_shards.json"


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
        skipped = f"; {unchanged} unchanged since their recorded check (size and mtime)" if unchanged else ""
        return (f"{self.files} files, {self.bytes / 1e9:.3f} GB: {self.hashed_files} hashed "
                f"({self.hashed_bytes / 1e9:.3f} GB) against the manifest's sizes and sha256 in {self.seconds:.2f} s "
                f"({self.seconds_per_gb:.2f} s per GB, {self.threads} threads){skipped}")


def verify_shard_set(path: str, manifest: dict[str, Any] | None = None, threads: int | None = None,
                     record: Path | None = None) -> Verification:
    """Hash the set's files against the manifest; with `record`, only those not recorded there as verified at their
    current size and mtime, and record the ones that pass."""
    # Imported here: data_prep.manifest loads Apache Beam (~1.5 s), which loader worker processes never need.
    from data_prep.manifest import read_manifest, shard_file_entries, verify_files

    manifest = manifest or read_manifest(path)
    entries = shard_file_entries(manifest)
    threads = threads or min(8, os.cpu_count() or 1, max(len(entries), 1))
    recorded = _read_record(record)
    stats = {entry["path"]: _stat(path, entry["path"]) for entry in entries}
    to_hash = [entry for entry in entries if recorded.get(_key(path, entry)) != _verified(entry, stats[entry["path"]])]
    started = time.perf_counter()
    bad = verify_files(path, to_hash, threads=threads)
    seconds = time.perf_counter() - started
    if record is not None:
        # The files that passed now or before, at the size and mtime they had when hashed (read before hashing: a
        # file rewritten meanwhile has another mtime at the next start, and is hashed again then).
        verified = {_key(path, entry): _verified(entry, stats[entry["path"]]) for entry in entries
                    if entry["path"] not in bad and stats[entry["path"]] is not None}
        write_atomically(record, json.dumps(verified, indent=1, sort_keys=True))
    return Verification(bad, len(entries), sum(int(e["bytes"]) for e in entries), seconds, threads,
                        len(to_hash), sum(int(e["bytes"]) for e in to_hash))


def _key(shard_dir: str, entry: dict[str, Any]) -> str:
    joined = f"{shard_dir.rstrip('/')}/{entry['path']}"
    return joined if "://" in shard_dir else str(Path(joined).resolve())


def _verified(entry: dict[str, Any], stat: tuple[int, int] | None) -> dict[str, Any] | None:
    if stat is None:
        return None
    return {"size": stat[0], "mtime_ns": stat[1], "sha256": entry["sha256"]}


def _stat(shard_dir: str, name: str) -> tuple[int, int] | None:
    """(size, mtime in ns) of a shard file, local or on any Beam filesystem; None when it cannot be read."""
    try:
        if "://" not in shard_dir:
            stat = os.stat(os.path.join(shard_dir, name))
            return stat.st_size, stat.st_mtime_ns
        from apache_beam.io.filesystems import FileSystems

        metadata = FileSystems.match([f"{shard_dir.rstrip('/')}/{name}"])[0].metadata_list[0]
        return int(metadata.size_in_bytes), int(metadata.last_updated_in_seconds * 1e9)
    except Exception:   # noqa: BLE001 - any filesystem's error: hash the file instead, which reports it
        return None


def _read_record(record: Path | None) -> dict[str, Any]:
    if record is None or not Path(record).is_file():
        return {}
    try:
        loaded = json.loads(Path(record).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}          # unreadable: verify everything again, and write it anew
    return loaded if isinstance(loaded, dict) else {}


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
