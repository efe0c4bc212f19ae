"""What identifies a shard set by its content, for whoever must notice that a set changed: a resume's check
(pipeline/pretraining/checks.py) and the workflow's stage identity (pipeline/orchestration/runs.py).

Each shard's rows, size and sha256 and the tokenizer, not the manifest's date; and what the manifest tells the loader
to train with beside the bytes: the objective and the masking. A dynamically masked set's shards hold no masks (the
loader draws them at the manifest's masked_lm_prob and whole-word setting), so a set re-prepared into the same
directory at another rate has the same bytes and is another set. Torch- and Beam-free: the workflow's controller
imports it.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

# The manifest's parameters that the loader reads to make a batch of the rows (pipeline/pretraining/data/shard_set.py)
TRAINING_PARAMETERS = ("objective", "masking", "masked_lm_prob", "whole_word_masking", "max_predictions_per_seq",
                       "max_seq_length")


def shard_set_content(manifest: dict[str, Any]) -> str:
    parameters = manifest.get("parameters") or {}
    record = {**_bytes_identity(manifest), "parameters": {key: parameters.get(key) for key in TRAINING_PARAMETERS}}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def shard_bytes_content(manifest: dict[str, Any]) -> str:
    """The shards and the tokenizer only: the identity that runs recorded before the parameters counted
    (pipeline/core/run/run_record.py compares such a record with it)."""
    return hashlib.sha256(json.dumps(_bytes_identity(manifest), sort_keys=True).encode()).hexdigest()


def _bytes_identity(manifest: dict[str, Any]) -> dict[str, Any]:
    tokenizer = manifest.get("tokenizer") or {}
    identity = {k: tokenizer.get(k) for k in ("vocab_sha256", "vocab_size", "lowercase")}
    if tokenizer.get("tokenizer_sha256"):   # a tokenizer.json set (BPE): its merges too, not only its vocabulary
        identity["tokenizer_sha256"] = tokenizer["tokenizer_sha256"]
    return {"shards": manifest.get("shards"), "tokenizer": identity}
