"""Check a shard set against its manifest (every file's size and sha256) before training reads it.

    python -m pipeline.pretraining.data.verify <shard set directory>

A corrupt shard otherwise surfaces as a decompression error wherever its row group happens to come in the
epoch, possibly hours into a run; hashing the set first costs seconds per GB (see README) and names the files.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any


@dataclasses.dataclass(frozen=True)
class Verification:
    bad_files: list[str]     # names (relative to the set) whose size or sha256 differs from the manifest
    files: int
    bytes: int
    seconds: float
    threads: int

    @property
    def seconds_per_gb(self) -> float:
        return self.seconds / max(self.bytes / 1e9, 1e-9)

    def describe(self) -> str:
        return (f"{self.files} files, {self.bytes / 1e9:.3f} GB, checked against the manifest's sizes and sha256 "
                f"in {self.seconds:.2f} s ({self.seconds_per_gb:.2f} s per GB, {self.threads} threads)")


def verify_shard_set(path: str, manifest: dict[str, Any] | None = None, threads: int | None = None) -> Verification:
    # Imported here: data_prep.manifest loads Apache Beam (~1.5 s), which loader worker processes never need.
    from data_prep.manifest import read_manifest, verify_checksums

    manifest = manifest or read_manifest(path)
    entries = [s[kind] for s in manifest["shards"] for kind in ("parquet", "tfrecord") if kind in s]
    threads = threads or min(8, os.cpu_count() or 1, max(len(entries), 1))
    started = time.perf_counter()
    bad = verify_checksums(path, manifest, threads=threads)
    return Verification(bad, len(entries), sum(int(e["bytes"]) for e in entries), time.perf_counter() - started,
                        threads)


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
