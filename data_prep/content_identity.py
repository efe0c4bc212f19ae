"""What identifies a shard set by its content, for whoever must notice that a set changed: a resume's check
(pipeline/pretraining/checks.py) and the workflow's stage identity (pipeline/orchestration/runs.py).

Each shard's rows, size and sha256 and the tokenizer, not the manifest's date. Torch- and Beam-free: the workflow's
controller imports it.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any


def shard_set_content(manifest: dict[str, Any]) -> str:
    tokenizer = manifest.get("tokenizer") or {}
    identity = {k: tokenizer.get(k) for k in ("vocab_sha256", "vocab_size", "lowercase")}
    if tokenizer.get("tokenizer_sha256"):   # a tokenizer.json set (BPE): its merges too, not only its vocabulary
        identity["tokenizer_sha256"] = tokenizer["tokenizer_sha256"]
    record = {"shards": manifest.get("shards"), "tokenizer": identity}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
