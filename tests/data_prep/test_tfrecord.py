"""TFRecord shards as google-research/bert's run_pretraining.py reads them.

Everything written here is decoded by readers that are not ours: Beam's TFRecord source (it checks the framing
and both CRCs) and the `tfrecord` package's reader (it parses the tf.train.Example protobufs).
"""
from __future__ import annotations

import io

import apache_beam as beam
import numpy as np
import pytest
from apache_beam import coders
from apache_beam.io import source_test_utils, tfrecordio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from tfrecord import example_pb2
from tfrecord.reader import tfrecord_iterator, tfrecord_loader

from data_prep.tfrecord_writer import encode_examples, frame_record, write_tfrecord_file

CLS, SEP, MASK = 101, 102, 103

DESCRIPTION = {
    "input_ids": "int",
    "input_mask": "int",
    "segment_ids": "int",
    "masked_lm_positions": "int",
    "masked_lm_ids": "int",
    "masked_lm_weights": "float",
    "next_sentence_labels": "int",
}


# --- an independent CRC-32C for Beam, used only where Beam finds none of its own backends --------------------

def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def _py_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def test_reference_crc32c_check_value():
    # The CRC-32C (Castagnoli) check value from the CRC catalogue.
    assert _py_crc32c(b"123456789") == 0xE3069283


@pytest.fixture(autouse=True)
def beam_crc32c(monkeypatch):
    """Beam's TFRecord IO needs python-snappy, google-crc32c or crcmod; without them, give it the plain-Python
    CRC-32C above (not the `crc32c` package the writer uses), so that its checks stay independent."""
    try:
        tfrecordio._default_crc32c_fn(b"")
    except RuntimeError:
        monkeypatch.setattr(tfrecordio._default_crc32c_fn, "fn", _py_crc32c)


# --- readers ---------------------------------------------------------------------------------------------------

def _beam_pipeline_read(path) -> list[bytes]:
    """ReadFromTFRecord in a DirectRunner pipeline; the records come back through a file written as a side
    effect (a FileSink in the pipeline would need the same CRC, so plain lines of hex are used)."""
    out = path.parent / (path.name + ".hex")

    class _Collect(beam.DoFn):
        def process(self, records):
            with open(out, "w") as f:
                f.write("\n".join(r.hex() for r in records))

    options = PipelineOptions(["--direct_running_mode=in_memory"])
    with beam.Pipeline(runner="DirectRunner", options=options) as p:
        records = p | beam.io.ReadFromTFRecord(str(path))
        (records | beam.combiners.ToList() | beam.ParDo(_Collect()))
    text = out.read_text()
    return [bytes.fromhex(line) for line in text.split("\n")] if text else []


def _beam_source_read(path) -> list[bytes]:
    source = tfrecordio._TFRecordSource(
        str(path), coders.BytesCoder(), CompressionTypes.UNCOMPRESSED, validate=True)
    return source_test_utils.read_from_source(source)


def _tfrecord_read(path) -> list[dict[str, np.ndarray]]:
    return list(tfrecord_loader(str(path), None, DESCRIPTION))


def _feature_kinds(record: bytes) -> dict[str, str]:
    example = example_pb2.Example()
    example.ParseFromString(record)
    return {k: f.WhichOneof("kind") for k, f in example.features.feature.items()}


def _write(path, records) -> int:
    with open(path, "wb") as f:
        return write_tfrecord_file(f, records)


# --- hand-made instances ---------------------------------------------------------------------------------------

SEQ, PRED = 12, 4
G = 999  # garbage beyond num_tokens / num_masked, which must not leak into the records

HAND = dict(
    input_ids=np.array([
        [CLS, 7, MASK, 9, SEP, 20, 21, SEP, G, G, G, G],
        [CLS, 30, 31, SEP, MASK, 41, 42, 43, 44, MASK, 46, SEP],
        [CLS, MASK, SEP, 50, SEP, G, G, G, G, G, G, G],
        [CLS, MASK, 61, SEP, MASK, MASK, SEP, G, G, G, G, G],
    ], dtype=np.int32),
    num_tokens=np.array([8, 12, 5, 7]),
    num_tokens_a=np.array([3, 2, 1, 2]),
    masked_positions=np.array([[2, -5, -5, -5, -5], [1, 4, 9, -5, -5], [-5] * 5, [1, 2, 4, 5, -5]]),
    masked_ids=np.array([[8, G, G, G, G], [31, 40, 45, G, G], [G] * 5, [60, 61, 70, 71, G]]),
    num_masked=np.array([1, 3, 0, 4]),
    next_sentence_labels=np.array([0, 1, 1, 0]),
)

EXPECTED = [
    dict(input_ids=[CLS, 7, MASK, 9, SEP, 20, 21, SEP, 0, 0, 0, 0],
         input_mask=[1] * 8 + [0] * 4,
         segment_ids=[0] * 5 + [1] * 3 + [0] * 4,
         masked_lm_positions=[2, 0, 0, 0], masked_lm_ids=[8, 0, 0, 0],
         masked_lm_weights=[1.0, 0.0, 0.0, 0.0], next_sentence_labels=[0]),
    dict(input_ids=[CLS, 30, 31, SEP, MASK, 41, 42, 43, 44, MASK, 46, SEP],
         input_mask=[1] * 12,
         segment_ids=[0] * 4 + [1] * 8,
         masked_lm_positions=[1, 4, 9, 0], masked_lm_ids=[31, 40, 45, 0],
         masked_lm_weights=[1.0, 1.0, 1.0, 0.0], next_sentence_labels=[1]),
    dict(input_ids=[CLS, MASK, SEP, 50, SEP, 0, 0, 0, 0, 0, 0, 0],
         input_mask=[1] * 5 + [0] * 7,
         segment_ids=[0, 0, 0, 1, 1] + [0] * 7,
         masked_lm_positions=[0, 0, 0, 0], masked_lm_ids=[0, 0, 0, 0],
         masked_lm_weights=[0.0, 0.0, 0.0, 0.0], next_sentence_labels=[1]),
    dict(input_ids=[CLS, MASK, 61, SEP, MASK, MASK, SEP, 0, 0, 0, 0, 0],
         input_mask=[1] * 7 + [0] * 5,
         segment_ids=[0] * 4 + [1] * 3 + [0] * 5,
         masked_lm_positions=[1, 2, 4, 5], masked_lm_ids=[60, 61, 70, 71],
         masked_lm_weights=[1.0, 1.0, 1.0, 1.0], next_sentence_labels=[0]),
]


def _hand_records(**overrides) -> list[bytes]:
    args = {**HAND, **overrides}
    return list(encode_examples(**args, max_seq_length=SEQ, max_predictions_per_seq=PRED))


@pytest.fixture
def hand_file(tmp_path):
    records = _hand_records()
    path = tmp_path / "hand.tfrecord"
    assert _write(path, records) == 4
    return path, records


def _check_example(got: dict[str, np.ndarray], want: dict[str, list]):
    assert set(got) == set(DESCRIPTION)
    for key, values in want.items():
        array = got[key]
        assert array.dtype == (np.float32 if key == "masked_lm_weights" else np.int64), key
        assert array.tolist() == values, key


def test_hand_made_beam_pipeline_reads_the_records(hand_file):
    path, records = hand_file
    assert _beam_pipeline_read(path) == records


def test_hand_made_beam_assert_that(hand_file):
    path, records = hand_file
    options = PipelineOptions(["--direct_running_mode=in_memory"])
    with beam.Pipeline(runner="DirectRunner", options=options) as p:
        assert_that(p | beam.io.ReadFromTFRecord(str(path)), equal_to(records))


def test_hand_made_tfrecord_reader_values(hand_file):
    path, records = hand_file
    got = _tfrecord_read(path)
    assert len(got) == len(EXPECTED)
    for example, want in zip(got, EXPECTED):
        _check_example(example, want)
    # Exactly the seven features of the reference, with the reference's list types.
    kinds = {**{k: "int64_list" for k in DESCRIPTION}, "masked_lm_weights": "float_list"}
    for record in records:
        assert _feature_kinds(record) == kinds


def test_tfrecord_reader_rejects_wrong_type_description(hand_file):
    # The reader's own type check: masked_lm_weights is a float list, input_ids an int64 list.
    path, _ = hand_file
    with pytest.raises(TypeError):
        _tfrecord_read_with(path, {"masked_lm_weights": "int"})
    with pytest.raises(TypeError):
        _tfrecord_read_with(path, {"input_ids": "float"})


def _tfrecord_read_with(path, description):
    return list(tfrecord_loader(str(path), None, description))


def test_framing_matches_beams_own_writer():
    for data in (b"", b"x", bytes(range(256)) * 3, _hand_records()[1]):
        buf = io.BytesIO()
        tfrecordio._TFRecordUtil.write_record(buf, data)
        assert frame_record(data) == buf.getvalue()
        assert len(frame_record(data)) == len(data) + 16


def test_encoding_is_deterministic_and_independent_of_shard_grouping():
    whole = _hand_records()
    one_by_one = [
        _hand_records(**{k: v[i:i + 1] for k, v in HAND.items()})[0] for i in range(4)
    ]
    assert whole == one_by_one == _hand_records()


def test_input_width_beyond_and_below_max_seq_length():
    wide = np.full((4, SEQ + 5), G, dtype=np.int64)
    wide[:, :SEQ] = HAND["input_ids"]
    for i, k in enumerate(HAND["num_tokens"]):
        wide[i, k:] = G
    assert _hand_records(input_ids=wide) == _hand_records()

    # Narrower than max_seq_length (rows of at most 8 tokens): padded out to max_seq_length.
    narrow_args = {k: v[[0, 2, 3]] for k, v in HAND.items()}
    narrow_args["input_ids"] = narrow_args["input_ids"][:, :8]
    narrow_args["masked_positions"] = narrow_args["masked_positions"][:, :4]
    narrow_args["masked_ids"] = narrow_args["masked_ids"][:, :4]
    full_args = {k: v[[0, 2, 3]] for k, v in HAND.items()}
    assert list(encode_examples(**narrow_args, max_seq_length=SEQ, max_predictions_per_seq=PRED)) == \
        list(encode_examples(**full_args, max_seq_length=SEQ, max_predictions_per_seq=PRED))


def test_empty_shard(tmp_path):
    empty = dict(
        input_ids=np.zeros((0, SEQ), np.int64), num_tokens=np.zeros(0, np.int64),
        num_tokens_a=np.zeros(0, np.int64), masked_positions=np.zeros((0, PRED), np.int64),
        masked_ids=np.zeros((0, PRED), np.int64), num_masked=np.zeros(0, np.int64),
        next_sentence_labels=np.zeros(0, np.int64))
    records = list(encode_examples(**empty, max_seq_length=SEQ, max_predictions_per_seq=PRED))
    assert records == []
    path = tmp_path / "empty.tfrecord"
    assert _write(path, records) == 0
    assert path.read_bytes() == b""
    assert _beam_source_read(path) == []


# --- corruption is detected by Beam -----------------------------------------------------------------------------

@pytest.mark.parametrize("where, message", [
    ("length", "Mismatch of length mask"),
    ("length_crc", "Mismatch of length mask"),
    ("data", "Mismatch of data mask"),
    ("data_crc", "Mismatch of data mask"),
])
def test_beam_source_detects_a_corrupted_byte(tmp_path, hand_file, where, message):
    path, records = hand_file
    # Corrupt the second record: its offsets follow from the first record's framed size.
    start = len(frame_record(records[0]))
    offset = {
        "length": start + 0,
        "length_crc": start + 9,
        "data": start + 12 + len(records[1]) // 2,
        "data_crc": start + 12 + len(records[1]) + 2,
    }[where]
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=message):
        _beam_source_read(bad)


def test_beam_pipeline_fails_on_a_corrupted_byte(tmp_path, hand_file):
    path, records = hand_file
    raw = bytearray(path.read_bytes())
    raw[12 + len(records[0]) // 2] ^= 0x40  # inside the first record's data
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(bytes(raw))
    with pytest.raises(Exception, match="Mismatch of data mask"):
        _beam_pipeline_read(bad)


# --- randomized round trip ----------------------------------------------------------------------------------------

def test_randomized_round_trip(tmp_path):
    rng = np.random.default_rng(20240601)
    n, seq, pred, width, pwidth = 200, 128, 20, 100, 24
    num_tokens = rng.integers(3, width + 1, n)
    num_tokens_a = rng.integers(0, num_tokens - 2)           # in [0, num_tokens - 3]
    input_ids = rng.integers(0, 30522, (n, width))
    num_masked = np.minimum(rng.integers(0, pred + 1, n), num_tokens)
    masked_positions = rng.integers(-9, 200, (n, pwidth))    # garbage everywhere beyond num_masked
    masked_ids = rng.integers(0, 30522, (n, pwidth))
    for i in range(n):
        masked_positions[i, :num_masked[i]] = np.sort(rng.choice(num_tokens[i], num_masked[i], replace=False))
    labels = rng.integers(0, 2, n)

    records = list(encode_examples(
        input_ids, num_tokens, num_tokens_a, masked_positions, masked_ids, num_masked, labels,
        max_seq_length=seq, max_predictions_per_seq=pred))
    path = tmp_path / "random.tfrecord"
    assert _write(path, iter(records)) == n

    assert _beam_source_read(path) == records
    assert [bytes(r) for r in tfrecord_iterator(str(path))] == records

    got = _tfrecord_read(path)
    assert len(got) == n
    for i, example in enumerate(got):
        k, a, m = int(num_tokens[i]), int(num_tokens_a[i]), int(num_masked[i])
        want = dict(
            input_ids=input_ids[i, :k].tolist() + [0] * (seq - k),
            input_mask=[1] * k + [0] * (seq - k),
            segment_ids=[0] * (a + 2) + [1] * (k - a - 2) + [0] * (seq - k),
            masked_lm_positions=masked_positions[i, :m].tolist() + [0] * (pred - m),
            masked_lm_ids=masked_ids[i, :m].tolist() + [0] * (pred - m),
            masked_lm_weights=[1.0] * m + [0.0] * (pred - m),
            next_sentence_labels=[int(labels[i])],
        )
        _check_example(example, want)
        assert all(len(example[key]) == seq for key in ("input_ids", "input_mask", "segment_ids"))
        assert all(len(example[key]) == pred
                   for key in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"))


# --- validation ---------------------------------------------------------------------------------------------------

def _replace(key, fn):
    return {key: fn(HAND[key].copy())}


def _set(key, index, value):
    def fn(a):
        a[index] = value
        return a
    return _replace(key, fn)


@pytest.mark.parametrize("overrides, kwargs, message", [
    (_set("num_tokens", 1, 13), {}, r"num_tokens exceeds max_seq_length=12 \(row 1\)"),
    ({"input_ids": HAND["input_ids"][:, :10]}, {}, r"width of input_ids \(10\) \(row 1\)"),
    (_set("num_masked", 3, 5), {}, r"num_masked exceeds max_predictions_per_seq=4 \(row 3\)"),
    ({"masked_positions": HAND["masked_positions"][:, :3], "masked_ids": HAND["masked_ids"][:, :3]}, {},
     r"width of masked_positions \(3\) \(row 3\)"),
    (_set("num_masked", 0, -1), {}, "num_masked is negative"),
    (_set("num_tokens_a", 2, 3), {}, r"num_tokens < num_tokens_a \+ 3"),
    (_set("num_tokens_a", 0, -1), {}, "num_tokens_a is negative"),
    (_set("next_sentence_labels", 0, 2), {}, "next_sentence_labels must be 0 or 1"),
    (_set("masked_positions", (1, 2), 12), {}, r"masked_positions outside \[0, num_tokens\) \(row 1\)"),
    (_set("masked_positions", (0, 0), -1), {}, r"masked_positions outside \[0, num_tokens\) \(row 0\)"),
    ({"num_tokens": HAND["num_tokens"][:3]}, {}, "num_tokens has 3 rows but input_ids has 4"),
    ({"next_sentence_labels": HAND["next_sentence_labels"][:, None]}, {}, "next_sentence_labels must be a 1-D"),
    ({"input_ids": HAND["input_ids"][0]}, {}, "input_ids must be a 2-D array"),
    ({"masked_ids": HAND["masked_ids"][:, :4]}, {}, "masked_positions and masked_ids differ in width"),
    ({"input_ids": HAND["input_ids"].astype(np.float64)}, {}, "input_ids must hold integers"),
    ({}, {"max_seq_length": 7}, r"num_tokens exceeds max_seq_length=7 \(row 0\)"),
    ({}, {"max_predictions_per_seq": 3}, r"num_masked exceeds max_predictions_per_seq=3 \(row 3\)"),
])
def test_invalid_input_raises_value_error_before_any_record(overrides, kwargs, message):
    args = {**HAND, **overrides}
    limits = {"max_seq_length": SEQ, "max_predictions_per_seq": PRED, **kwargs}
    with pytest.raises(ValueError, match=message):
        encode_examples(**args, **limits)  # raised at the call, not on first iteration
