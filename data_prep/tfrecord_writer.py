"""TFRecord shards in the exact format of google-research/bert's ``create_pretraining_data.py``.

Each instance becomes one ``tf.train.Example`` with the seven features that ``run_pretraining.py`` reads
(``write_instance_to_example_files`` in the reference)::

    input_ids             int64[max_seq_length]           token ids, 0-padded
    input_mask            int64[max_seq_length]           1 for real tokens, 0 for padding
    segment_ids           int64[max_seq_length]           0 for [CLS] A [SEP], 1 for B [SEP], 0 for padding
    masked_lm_positions   int64[max_predictions_per_seq]  0-padded
    masked_lm_ids         int64[max_predictions_per_seq]  0-padded
    masked_lm_weights     float[max_predictions_per_seq]  1.0 per real prediction, 0.0 padding
    next_sentence_labels  int64[1]                        1 = B is a random sentence, 0 = B is the actual next

Records are framed as TFRecord: uint64 length (little-endian), uint32 masked crc32c of those 8 bytes, the data,
uint32 masked crc32c of the data. Only numpy, ``crc32c`` and the protobuf classes of the ``tfrecord`` package are
needed (no tensorflow). Padding and masks are built for a whole shard at once with numpy; per instance only
``tolist()`` + ``RepeatedScalarContainer.extend`` + serialization remain in Python.
"""
from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import crc32c as _crc32c
import numpy as np
from tfrecord import example_pb2

__all__ = ["encode_examples", "frame_record", "masked_crc32c", "write_tfrecord_file", "FEATURE_NAMES"]

# In the reference's order (an OrderedDict there); serialized maps are written with sorted keys
# (deterministic=True) so that the same instances always give the same bytes.
FEATURE_NAMES = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
)

_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_LENGTH = struct.Struct("<Q")
_U32_LE = struct.Struct("<I")


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C: rotate right by 15 bits, add 0xa282ead8 (mod 2**32)."""
    crc = _crc32c.crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


def frame_record(data: bytes) -> bytes:
    """One TFRecord: length, masked crc of the length, ``data``, masked crc of ``data``."""
    length = _LENGTH.pack(len(data))
    return b"".join(
        (length, _U32_LE.pack(masked_crc32c(length)), data, _U32_LE.pack(masked_crc32c(data)))
    )


def write_tfrecord_file(file_obj: BinaryIO, records: Iterable[bytes]) -> int:
    """Write each record, framed, to a binary file object; return how many were written."""
    count = 0
    for record in records:
        file_obj.write(frame_record(record))
        count += 1
    return count


def _as_int_array(name: str, value, ndim: int, allow_bool: bool = False) -> np.ndarray:
    arr = np.asarray(value)
    kinds = "iub" if allow_bool else "iu"
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D array, got shape {arr.shape}")
    if arr.dtype.kind not in kinds and not (arr.size == 0 and arr.dtype.kind == "f"):
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _first_bad_row(condition: np.ndarray) -> int:
    return int(np.flatnonzero(condition)[0])


def encode_examples(
    input_ids: np.ndarray,
    num_tokens: np.ndarray,
    num_tokens_a: np.ndarray,
    masked_positions: np.ndarray,
    masked_ids: np.ndarray,
    num_masked: np.ndarray,
    next_sentence_labels: np.ndarray,
    *,
    max_seq_length: int,
    max_predictions_per_seq: int,
) -> Iterator[bytes]:
    """Serialized ``tf.train.Example`` protobufs, one per row, as the reference writes them.

    Row i's tokens are ``input_ids[i, :num_tokens[i]]`` (already masked; ``[CLS] A [SEP] B [SEP]``), where A has
    ``num_tokens_a[i]`` tokens, so segment 0 covers the first ``num_tokens_a[i] + 2`` positions. Its predictions
    are ``masked_positions[i, :num_masked[i]]`` / ``masked_ids[i, :num_masked[i]]``. Anything beyond those
    lengths in the 2-D arrays is ignored. All arguments are checked before the first record is produced; a
    bad shape or length raises ValueError naming the argument (and the first bad row).
    """
    max_seq_length = int(max_seq_length)
    max_predictions_per_seq = int(max_predictions_per_seq)
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be >= 3 ([CLS] + 2 x [SEP]), got {max_seq_length}")
    if max_predictions_per_seq < 0:
        raise ValueError(f"max_predictions_per_seq must be >= 0, got {max_predictions_per_seq}")

    ids = _as_int_array("input_ids", input_ids, 2)
    n_tok = _as_int_array("num_tokens", num_tokens, 1)
    n_a = _as_int_array("num_tokens_a", num_tokens_a, 1)
    pos = _as_int_array("masked_positions", masked_positions, 2)
    mids = _as_int_array("masked_ids", masked_ids, 2)
    n_m = _as_int_array("num_masked", num_masked, 1)
    nsl = _as_int_array("next_sentence_labels", next_sentence_labels, 1, allow_bool=True)

    n = ids.shape[0]
    for name, arr in (
        ("num_tokens", n_tok),
        ("num_tokens_a", n_a),
        ("masked_positions", pos),
        ("masked_ids", mids),
        ("num_masked", n_m),
        ("next_sentence_labels", nsl),
    ):
        if arr.shape[0] != n:
            raise ValueError(f"{name} has {arr.shape[0]} rows but input_ids has {n}")
    if pos.shape[1] != mids.shape[1]:
        raise ValueError(
            f"masked_positions and masked_ids differ in width: {pos.shape[1]} vs {mids.shape[1]}"
        )
    if n == 0:
        return iter(())

    checks = (
        (n_tok > max_seq_length, f"num_tokens exceeds max_seq_length={max_seq_length}"),
        (n_tok > ids.shape[1], f"num_tokens exceeds the width of input_ids ({ids.shape[1]})"),
        (n_a < 0, "num_tokens_a is negative"),
        (n_a + 3 > n_tok, "num_tokens < num_tokens_a + 3 (no room for [CLS] A [SEP] B [SEP])"),
        (n_m < 0, "num_masked is negative"),
        (n_m > max_predictions_per_seq,
         f"num_masked exceeds max_predictions_per_seq={max_predictions_per_seq}"),
        (n_m > pos.shape[1], f"num_masked exceeds the width of masked_positions ({pos.shape[1]})"),
        ((nsl != 0) & (nsl != 1), "next_sentence_labels must be 0 or 1"),
    )
    for bad, message in checks:
        if bad.any():
            row = _first_bad_row(bad)
            raise ValueError(f"{message} (row {row})")

    # Whole-shard padding with numpy; masks, segments and weights depend only on the lengths and are built
    # as Python lists directly (input_mask and weights once per distinct length).
    width = min(ids.shape[1], max_seq_length)
    ids_out = np.zeros((n, max_seq_length), dtype=np.int64)
    ids_out[:, :width] = ids[:, :width]
    ids_out[np.arange(max_seq_length) >= n_tok[:, None]] = 0

    pred_real = np.arange(max_predictions_per_seq) < n_m[:, None]   # (n, P) bool
    pwidth = min(pos.shape[1], max_predictions_per_seq)
    pos_out = np.zeros((n, max_predictions_per_seq), dtype=np.int64)
    pos_out[:, :pwidth] = pos[:, :pwidth]
    pos_out[~pred_real] = 0
    mids_out = np.zeros((n, max_predictions_per_seq), dtype=np.int64)
    mids_out[:, :pwidth] = mids[:, :pwidth]
    mids_out[~pred_real] = 0

    bad_pos = pred_real & ((pos_out < 0) | (pos_out >= n_tok[:, None]))
    if bad_pos.any():
        row = _first_bad_row(bad_pos.any(axis=1))
        raise ValueError(f"masked_positions outside [0, num_tokens) (row {row})")

    return _serialize_rows(
        ids_out, n_tok.tolist(), n_a.tolist(), pos_out, mids_out, n_m.tolist(),
        nsl.tolist(), max_seq_length, max_predictions_per_seq,
    )


def _serialize_rows(
    ids: np.ndarray, n_tok: list, n_a: list, pos: np.ndarray, mids: np.ndarray, n_m: list, nsl: list,
    seq_len: int, max_pred: int,
) -> Iterator[bytes]:
    input_mask = [[1] * k + [0] * (seq_len - k) for k in range(seq_len + 1)]
    weights = [[1.0] * k + [0.0] * (max_pred - k) for k in range(max_pred + 1)]

    # The 2-D arrays become lists a row at a time (about twice as fast as one big tolist(), which leaves the
    # cache). One Example is refilled per row (slice assignment replaces the values) and serialized at once;
    # deterministic=True writes the feature map sorted by key, so equal instances give equal bytes.
    example = example_pb2.Example()
    feature = example.features.feature
    v_ids = feature["input_ids"].int64_list.value
    v_mask = feature["input_mask"].int64_list.value
    v_seg = feature["segment_ids"].int64_list.value
    v_pos = feature["masked_lm_positions"].int64_list.value
    v_mids = feature["masked_lm_ids"].int64_list.value
    v_w = feature["masked_lm_weights"].float_list.value
    v_nsl = feature["next_sentence_labels"].int64_list.value
    v_nsl.append(0)
    serialize = example.SerializeToString

    for row_ids, k, a, row_pos, row_mids, m, label in zip(ids, n_tok, n_a, pos, mids, n_m, nsl):
        v_ids[:] = row_ids.tolist()
        v_mask[:] = input_mask[k]
        v_seg[:] = [0] * (a + 2) + [1] * (k - a - 2) + [0] * (seq_len - k)
        v_pos[:] = row_pos.tolist()
        v_mids[:] = row_mids.tolist()
        v_w[:] = weights[m]
        v_nsl[0] = label
        yield serialize(deterministic=True)
