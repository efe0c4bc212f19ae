"""Reading what W&B wrote offline: its transaction log's records, and the logged history rows."""
from __future__ import annotations

import json
import struct
from pathlib import Path


def read_wandb_records(path: Path) -> list:
    """The records of a W&B transaction log (run-*.wandb): a LevelDB-style log of wandb_internal_pb2.Record
    protobufs (7-byte file header ':W&B' + magic 0xBEE1 + version; 32 KiB blocks; 7-byte record headers of crc32,
    length, type FULL/FIRST/MIDDLE/LAST). wandb 0.31 ships no Python reader for it (the Go core writes it)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log")
    block, pos, pending, raw_records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left_in_block = block - pos % block
        if left_in_block < 7:       # a block's tail too short for a header is padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:               # zero padding up to the next block
            pos += left_in_block
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            raw_records.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            raw_records.append(pending + chunk)
            pending = b""
        else:
            raise ValueError(f"{path}: unknown record type {kind} at byte {pos}")
    records = []
    for raw in raw_records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        records.append(record)
    return records


def wandb_history(path: Path) -> list[dict[str, float | str]]:
    rows = []
    for record in read_wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({(item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                         for item in record.history.item})
    return rows
