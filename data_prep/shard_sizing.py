"""How many shards: one per `shard_target_mb` of raw text, the raw text estimated before the job reads its inputs.

A shard is one bucket of documents and its writer holds the bucket, so the shard size sets the writer's memory. Raw
text is the inputs' sizes times what compression does to them, measured, not assumed: per (format, compression) the
first SAMPLE_BYTES of up to SAMPLE_FILES files, spread over the group, are decompressed as the readers do, and the
group's ratio is their raw bytes over their compressed bytes (a fixed x4 for bz2 and x1 for gzip made Gutenberg
books in gzip, which shrink about 2.6x, into shards of 2.6 times the setting). Uncompressed files count as their
size. The manifest records how the count was chosen (`sizing`).

The count shapes the data (a document's bucket is its hash modulo the count), so an existing shard set is kept as
it is: a re-run into an output whose manifest has the same inputs and shard_target_mb takes that set's count, and
its shards come out byte-identical, whichever way the earlier count was chosen.
"""
from __future__ import annotations

import concurrent.futures
import logging
import math
from typing import Any

from data_prep.config import PrepConfig

log = logging.getLogger(__name__)

SAMPLE_BYTES = 8 << 20   # compressed bytes decompressed from the start of each sampled file
SAMPLE_FILES = 8         # files sampled per (format, compression) group
_COMPRESSION_BY_SUFFIX = {".bz2": "bz2", ".gz": "gzip"}
_SAMPLE_THREADS = 16
# What ec81dd5 and earlier did, for a manifest that predates `sizing`.
_FIXED_ESTIMATE = "raw text estimated as 4x the size of .bz2 inputs and 1x of all others (before sampled ratios)"


def compression_of(path: str) -> str:
    return next((kind for suffix, kind in _COMPRESSION_BY_SUFFIX.items() if path.endswith(suffix)), "none")


def size_shards(config: PrepConfig, files: tuple, existing: dict[str, Any] | None = None) -> tuple[int, dict]:
    """The shard count, and how it was chosen (the manifest's `sizing`). `files` are the plan's InputFiles;
    `existing` the manifest of the shard set already in the output directory, if any."""
    if config.num_shards is not None:
        return config.num_shards, {"method": "num_shards", "num_shards": config.num_shards}
    kept = _kept_from(existing, config, files)
    if kept is not None:
        return kept
    groups = sampled_ratios(files)
    raw_bytes = sum(group["bytes"] * group["ratio"] for group in groups)
    count = max(1, math.ceil(raw_bytes / (config.shard_target_mb * 1e6)))
    log.info("%d shards of about %.0f MB of text: %s", count, raw_bytes / count / 1e6, "; ".join(
        f"{g['format']} ({g['compression']}) x{g['ratio']:.2f}" for g in groups))
    return count, {"method": "sampled_ratios", "num_shards": count, "shard_target_mb": config.shard_target_mb,
                   "estimated_raw_bytes": round(raw_bytes), "groups": groups}


def sampled_ratios(files: tuple) -> list[dict[str, Any]]:
    """Per (format, compression): its files, their bytes, and raw bytes per compressed byte, sampled."""
    grouped: dict[tuple[str, str], list] = {}
    for input_file in files:
        grouped.setdefault((input_file.format, compression_of(input_file.path)), []).append(input_file)
    samples = {key: _spread(members, SAMPLE_FILES) for key, members in grouped.items() if key[1] != "none"}
    paths = sorted({f.path for members in samples.values() for f in members})
    with concurrent.futures.ThreadPoolExecutor(_SAMPLE_THREADS) as pool:   # reading and zlib/bz2 release the GIL
        measured = dict(zip(paths, pool.map(_measure, paths)))
    groups = []
    for (fmt, compression), members in sorted(grouped.items()):
        group = {"format": fmt, "compression": compression, "files": len(members),
                 "bytes": sum(f.size_bytes for f in members), "ratio": 1.0}
        if compression != "none":
            sizes = [measured[f.path] for f in samples[(fmt, compression)] if measured[f.path] is not None]
            raw, packed = sum(r for r, _ in sizes), sum(c for _, c in sizes)
            group.update(sampled_files=len(sizes), sampled_bytes=packed, sampled_raw_bytes=raw,
                         ratio=round(raw / packed, 4) if packed and raw else 1.0)
        groups.append(group)
    return groups


def _spread(members: list, count: int) -> list:
    """`count` members evenly spread over the list (all of them when it is shorter): a large set's files differ."""
    if len(members) <= count:
        return members
    return [members[i * len(members) // count] for i in range(count)]


def _measure(path: str) -> tuple[int, int] | None:
    from data_prep.readers._io import InputError, sampled_sizes
    try:
        return sampled_sizes(path, SAMPLE_BYTES)
    except InputError as error:   # the reader will count this file as skipped; the others size the group
        log.warning("%s: not sampled for the shard size (%s)", path, error)
        return None


def _kept_from(existing: dict[str, Any] | None, config: PrepConfig, files: tuple) -> tuple[int, dict] | None:
    """The existing shard set's count where it was made from the same inputs and shard_target_mb; None otherwise."""
    if not existing or "num_shards_planned" not in existing:
        return None
    parameters = existing.get("parameters") or {}
    same_inputs = [_identity(f) for f in existing.get("inputs") or []] == [_identity(vars(f)) for f in files]
    if parameters.get("num_shards") is not None or parameters.get("shard_target_mb") != config.shard_target_mb \
            or not same_inputs:
        log.info("the shard set in %s was made from other inputs or shard settings: this run sizes its own",
                 config.output_dir)
        return None
    count = int(existing["num_shards_planned"])
    sizing = existing.get("sizing") or {"method": "fixed_ratios", "num_shards": count,
                                        "shard_target_mb": config.shard_target_mb, "note": _FIXED_ESTIMATE}
    log.info("%d shards, as the existing shard set in %s (same inputs and shard_target_mb; sized by %s), so that "
             "its shards come out the same", count, config.output_dir, sizing.get("method"))
    return count, sizing


def _identity(input_file: dict[str, Any]) -> tuple:
    """What the shard count depends on in an input file: its name in the set, format and size (not where it lies)."""
    return (input_file.get("source_name"), input_file.get("format"), input_file.get("text_column"),
            input_file.get("size_bytes"))
