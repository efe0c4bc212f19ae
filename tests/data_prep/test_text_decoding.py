"""Tests for data_prep.text_decoding: UTF-8 first, cp1252/Latin-1 only for the lines that need it."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep.text_decoding import BINARY_SNIFF_BYTES, decode_line, decode_text, looks_binary

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_valid_utf8_is_decoded_as_is():
    raw = "naïve café — “quoted” 日本語\n".encode()
    assert decode_text(raw) == ("naïve café — “quoted” 日本語\n", 0)


def test_bom_is_dropped():
    assert decode_text(b"\xef\xbb\xbfhello") == ("hello", 0)
    # a BOM on a file that also needs repairs
    assert decode_text(b"\xef\xbb\xbfhello\ncaf\xe9") == ("hello\ncafé", 1)


def test_only_the_bad_lines_are_read_as_cp1252():
    raw = "ok – line\n".encode() + b"Bruneti\xe8re, Copp\xe9e\r\n" + "fine ü\n".encode() + b"\x93quoted\x94\n"
    text, repaired = decode_text(raw)
    assert text == "ok – line\nBrunetière, Coppée\r\nfine ü\n“quoted”\n"
    assert repaired == 2


def test_bytes_cp1252_cannot_map_fall_back_to_latin1():
    # 0x81, 0x8D, 0x8F, 0x90, 0x9D are undefined in cp1252
    text, repaired = decode_text(b"a\x81b\x8dc\x8fd\x90e\x9df\x80")
    assert text == "a\x81b\x8dc\x8fd\x90e\x9df€"
    assert repaired == 1


def test_line_ends_are_kept_and_lines_counted_at_cr_and_lf():
    text, repaired = decode_text(b"\xe9\r\xe9\n\xe9\r\nok")
    assert text == "é\ré\né\r\nok"
    assert repaired == 3


def test_decode_line():
    assert decode_line(b"plain") == ("plain", False)
    assert decode_line("ü".encode()) == ("ü", False)
    assert decode_line(b"\xfc") == ("ü", True)


def test_chesterton_latin1_byte_is_kept(shared_data: Path):
    raw = (shared_data / "corpora" / "books" / "chesterton-ball.txt").read_bytes()
    text, repaired = decode_text(raw)
    assert "Brunetière" in text
    assert "local café." in text
    assert repaired == 2
    assert "\ufffd" not in text
    assert len(text.splitlines()) == len(raw.splitlines())


def test_ten_megabyte_line_is_linear():
    good = b"word " * 2_000_000  # 10 MB, one line
    bad = good + b"\xe9"
    start = time.perf_counter()
    assert decode_text(good) == (good.decode(), 0)
    text, repaired = decode_text(bad)
    assert repaired == 1 and len(text) == len(bad) and text.endswith("word é")
    assert time.perf_counter() - start < 5


def test_many_bad_lines_are_linear():
    raw = b"caf\xe9 au lait\n" * 200_000  # 2.6 MB, every line bad
    start = time.perf_counter()
    text, repaired = decode_text(raw)
    assert repaired == 200_000
    assert text == "café au lait\n" * 200_000
    assert time.perf_counter() - start < 5


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_decode_text_never_raises_and_keeps_every_line(raw: bytes):
    text, repaired = decode_text(raw)
    body = raw[3:] if raw.startswith(b"\xef\xbb\xbf") else raw
    assert 0 <= repaired <= len(body.splitlines())
    assert len(text.splitlines()) >= len(body.splitlines())  # str.splitlines also splits at \x1c, \x85, ...


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_valid_utf8_round_trips(text: str):
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates cannot be UTF-8
        return
    if raw.startswith(b"\xef\xbb\xbf"):
        return
    assert decode_text(raw) == (text, 0)


@pytest.mark.parametrize(
    ("head", "binary"),
    [
        (b"", False),
        (b"Plain text.\nWith lines\tand tabs.\r\n\x0c", False),
        ("Große Straße, naïve, 日本語".encode(), False),
        (b"caf\xe9 latin-1 is text", False),
        (b"\x1b[31mred\x1b[0m log line\n" * 10, False),
        (b"text with one NUL\x00", True),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", True),
        (bytes(range(1, 32)) * 4, True),
        (b"a" * 80 + b"\x01" * 12, True),  # 13% control bytes
        (b"a" * 95 + b"\x01" * 5, False),  # 5%
    ],
)
def test_looks_binary(head: bytes, binary: bool):
    assert looks_binary(head) is binary


def test_looks_binary_reads_only_the_head():
    assert looks_binary(b"a" * BINARY_SNIFF_BYTES + b"\x00") is False
