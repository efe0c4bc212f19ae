"""Byte streams for the readers: open through Beam's FileSystems, decompress ourselves, stream.

Every failure of the input itself is raised as :class:`InputError` carrying the :class:`SkipReason` to count, so
that each reader can turn it into one ``Skip`` and stop that file, keeping what it already yielded.
"""
from __future__ import annotations

import bz2
import collections
import zlib
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from data_prep.documents import Repair, Skip, SkipReason

READ_SIZE = 1 << 20
"""Bytes asked of the file per read."""

OUTPUT_SIZE = 1 << 18
"""At most this many decompressed bytes per step, so that a tiny, very compressible input cannot balloon."""

MAX_LINE_CHARS = 1_000_000
"""The longest line of text a reader takes (the default of data prep's ``max_line_chars``); longer lines are skipped
and counted as ``line_too_long``, never assembled.

Real prose is far below it: sentences run to a few hundred characters, the longest paragraphs in print to some
tens of thousands, a chapter written as one line to about 100,000. What is above it is not text to learn from (an
encoded blob, minified data, a dump without line breaks), and it costs: tokenizers keeps ~16 bytes of offsets per
byte of a sentence (a 200 MB line asked for 3.2 GB and aborted the worker), and the readers' clean-up splits a line
into words. At the bound a line costs a worker some tens of MB at most.
"""

COMPRESSED_LAG = 2 << 20
"""Decompressed bytes held back from the consumer until this many more have been decompressed cleanly.

A bz2 decompressor hands out a block's bytes (up to ~900 KB, about 1 MB of XML) before it checks that block's
CRC, so a damaged block first comes out as garbage and only then fails.  Holding back about two blocks means
the reader does not parse the garbage: on a data error the held-back bytes are thrown away.  On truncation (the
stream just ends) they are handed out, because every complete block has passed its check.
"""


class InputError(Exception):
    """The input is bad (not the code): the reader yields ``Skip(reason)`` and stops this file."""

    def __init__(self, reason: SkipReason, detail: str):
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


class _Truncated(InputError):
    """The compressed stream ended before its end-of-stream marker: all output so far is good."""

    def __init__(self, detail: str):
        super().__init__(SkipReason.CORRUPT_COMPRESSION, detail)


def open_file(path: str) -> BinaryIO:
    """Open ``path`` (local or gs://...) for binary reading, without Beam's own decompression."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    try:
        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    except Exception as error:  # noqa: BLE001 - any failure to open is a property of the input (missing, denied)
        raise InputError(SkipReason.UNREADABLE_FILE, f"cannot open: {type(error).__name__}: {error}") from error


def _raw_chunks(fileobj: BinaryIO) -> Iterator[bytes]:
    while True:
        try:
            chunk = fileobj.read(READ_SIZE)
        except Exception as error:  # noqa: BLE001 - a failing read (disk, network) is a property of the input
            raise InputError(SkipReason.UNREADABLE_FILE, f"read failed: {type(error).__name__}: {error}") from error
        if not chunk:
            return
        yield chunk


def _sniff_compression(head: bytes) -> str | None:
    """'bz2', 'gzip' or None, from the magic bytes (file names lie; dump shards are named '...xml-p10p30302.bz2')."""
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[4:10] in (b"1AY&SY", b"\x17rE8P\x90"):
        return "bz2"
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    return None


def _new_decompressor(kind: str):
    return bz2.BZ2Decompressor() if kind == "bz2" else zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)


def _decompress(chunks: Iterable[bytes], kind: str) -> Iterator[bytes]:
    """Decompress concatenated bz2 streams or gzip members (multistream dumps, ``cat a.gz b.gz``)."""
    decompressor = _new_decompressor(kind)
    in_stream = False  # the current decompressor has been given input and has not reached its end
    streams = 0
    for chunk in chunks:
        data = chunk
        while data:
            if not in_stream and streams and not data.strip(b"\x00"):
                data = b""  # NUL padding after the last stream (tape/tar style): not an error
                break
            in_stream = True
            try:
                if kind == "bz2":
                    out = decompressor.decompress(data, max_length=OUTPUT_SIZE)
                    data = b""
                    if out:
                        yield out
                    while not decompressor.eof and not decompressor.needs_input:
                        out = decompressor.decompress(b"", max_length=OUTPUT_SIZE)
                        if out:
                            yield out
                else:
                    while data and not decompressor.eof:
                        out = decompressor.decompress(data, OUTPUT_SIZE)
                        data = decompressor.unconsumed_tail
                        if out:
                            yield out
            except (OSError, EOFError, ValueError, zlib.error) as error:
                raise InputError(
                    SkipReason.CORRUPT_COMPRESSION, f"{kind} stream {streams + 1}: {type(error).__name__}: {error}"
                ) from error
            if decompressor.eof:
                data = decompressor.unused_data + data
                decompressor = _new_decompressor(kind)
                in_stream = False
                streams += 1
    if in_stream and kind == "gzip":
        try:
            out = decompressor.flush()
        except zlib.error as error:
            raise InputError(SkipReason.CORRUPT_COMPRESSION, f"gzip member {streams + 1}: {error}") from error
        if out:
            yield out
        in_stream = not decompressor.eof
    if in_stream:
        raise _Truncated(f"{kind} stream {streams + 1} ended before its end-of-stream marker (truncated file)")


def _held_back(chunks: Iterable[bytes], lag: int) -> Iterator[bytes]:
    """Pass chunks on only once ``lag`` more bytes have arrived after them (see :data:`COMPRESSED_LAG`)."""
    held: collections.deque[bytes] = collections.deque()
    size = 0
    try:
        for chunk in chunks:
            held.append(chunk)
            size += len(chunk)
            while held and size - len(held[0]) >= lag:
                size -= len(held[0])
                yield held.popleft()
    except _Truncated:
        yield from held  # complete blocks only: good data
        raise
    # any other error propagates and the held-back (possibly garbage) bytes are dropped
    yield from held


def iter_bytes(path: str, *, lag: int = COMPRESSED_LAG) -> Iterator[bytes]:
    """The content of ``path`` as a stream of byte chunks, decompressed if it is bz2 or gzip (by magic bytes).

    Raises :class:`InputError` (UNREADABLE_FILE, CORRUPT_COMPRESSION) when the input is bad; the chunks before
    the error are good.  A file named ``.bz2``/``.gz`` whose content is not compressed counts as corrupt.
    """
    fileobj = open_file(path)
    try:
        raw = _raw_chunks(fileobj)
        head = b""
        for chunk in raw:  # a few bytes are enough to sniff, but a read may return fewer
            head += chunk
            if len(head) >= 16:
                break
        if not head:
            return
        kind = _sniff_compression(head)
        lowered = path.lower()
        if kind is None and (lowered.endswith(".bz2") or lowered.endswith(".gz")):
            raise InputError(SkipReason.CORRUPT_COMPRESSION, "named as compressed, but not a bz2/gzip stream")

        def all_raw() -> Iterator[bytes]:
            yield head
            yield from raw

        if kind is None:
            yield from all_raw()
        else:
            yield from _held_back(_decompress(all_raw(), kind), lag)
    finally:
        try:
            fileobj.close()
        except Exception:  # noqa: BLE001 - closing a read-only handle; nothing to lose
            pass


def sampled_sizes(path: str, limit: int) -> tuple[int, int]:
    """(decompressed bytes, compressed bytes) of the first ``limit`` bytes of a file, decompressed as the readers
    do: what compression does to it, measured on its start (on all of it when it is smaller). A bz2 block cut at
    the end gives nothing, so a cut sample errs towards a lower ratio (smaller shards).

    Raises :class:`InputError` for an unreadable or corrupt file.
    """
    fileobj = open_file(path)
    try:
        head, size = [], 0
        for chunk in _raw_chunks(fileobj):
            head.append(chunk[: limit - size])
            size += len(head[-1])
            if size >= limit:
                break
    finally:
        fileobj.close()
    data = b"".join(head)
    kind = _sniff_compression(data)
    if kind is None:
        return len(data), len(data)
    raw = 0
    try:
        for out in _decompress([data], kind):
            raw += len(out)
    except _Truncated:
        pass   # the sample ends inside a stream: what came out of it counts
    return raw, len(data)


class LongLine:
    """In place of a line longer than the bound of :func:`iter_lines`: its length in bytes, not its bytes."""

    __slots__ = ("size",)

    def __init__(self, size: int):
        self.size = size


def _without_cr(line: bytes) -> bytes:
    return line[:-1] if line.endswith(b"\r") else line


def iter_lines(chunks: Iterable[bytes], max_bytes: int | None = None) -> Iterator[bytes | LongLine]:
    """Split a chunk stream into lines at ``\\n`` (a trailing ``\\r`` is dropped too); linear in the line length.

    A line of more than ``max_bytes`` bytes comes out as a :class:`LongLine`: its bytes are let go as they arrive, so
    the caller never holds more than ``max_bytes`` of a line, whatever its length.
    """
    limit = float("inf") if max_bytes is None else max_bytes
    pending: list[bytes] = []
    size = 0   # of the line being assembled, the bytes let go included
    for chunk in chunks:
        *complete, rest = chunk.split(b"\n")
        if complete:
            size += len(complete[0])
            yield LongLine(size) if size > limit else _without_cr(b"".join([*pending, complete[0]]))
            for piece in complete[1:]:
                yield LongLine(len(piece)) if len(piece) > limit else _without_cr(piece)
            pending, size = [], 0
        size += len(rest)
        if size > limit:
            pending = []
        elif rest:
            pending.append(rest)
    if size:
        yield LongLine(size) if size > limit else _without_cr(b"".join(pending))


def lf_line_ends(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The chunk stream with every line end as ``\\n``: ``\\r\\n`` and a lone ``\\r`` (old Mac files) too, so that a
    line is the same thing in every file (a Mac file is not one line of the whole file's length)."""
    after_cr = False
    for chunk in chunks:
        if after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]   # the LF of a CRLF cut between chunks: the CR already ended the line
        after_cr = chunk.endswith(b"\r")
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if chunk:
            yield chunk


class LineStats:
    """What :func:`text_lines` saw: repaired (non-UTF-8) lines, whether any line had text, and the lines it left out
    for being longer than its bound (how many, the first few line numbers, the longest in bytes)."""

    SHOWN_LONG_LINES = 5

    def __init__(self) -> None:
        self.repaired = 0
        self.content = False
        self.long_lines = 0
        self.long_line_numbers: list[int] = []
        self.longest_bytes = 0

    def count_long_line(self, number: int, size: int) -> None:
        self.content = True
        self.long_lines += 1
        if len(self.long_line_numbers) < self.SHOWN_LONG_LINES:
            self.long_line_numbers.append(number)
        self.longest_bytes = max(self.longest_bytes, size)

    def long_line_skip(self, source_name: str, max_line_chars: int) -> Skip | None:
        """The counted ``Skip`` of the long lines left out (the file is its source), saying where; None if none."""
        if not self.long_lines:
            return None
        more = self.long_lines - len(self.long_line_numbers)
        where = ", ".join(map(str, self.long_line_numbers)) + (f" and {more:,} more" if more else "")
        return Skip(SkipReason.LINE_TOO_LONG.value, source_name, count=self.long_lines,
                    detail=f"line{'s' if self.long_lines > 1 else ''} {where} longer than "
                           f"max_line_chars={max_line_chars:,}, the longest {self.longest_bytes:,} bytes")

    def closing_skips(self, source_name: str, max_line_chars: int) -> Iterator[Skip]:
        """What a reader says of a file after its documents: the long lines left out, then the repaired lines."""
        if long_lines := self.long_line_skip(source_name, max_line_chars):
            yield long_lines
        if self.repaired:
            yield Skip(Repair.NON_UTF8_LINES.value, source_name, count=self.repaired)


def _sniffed(chunks: Iterator[bytes], size: int) -> tuple[bytes, Iterator[bytes]]:
    """The first ``size`` bytes of a chunk stream, and the whole stream again."""
    head: list[bytes] = []
    seen = 0
    for chunk in chunks:
        head.append(chunk)
        seen += len(chunk)
        if seen >= size:
            break

    def again() -> Iterator[bytes]:
        yield from head
        yield from chunks

    return b"".join(head)[:size], again()


def text_lines(path: str, stats: LineStats, max_line_chars: int = MAX_LINE_CHARS) -> Iterator[tuple[int, str]]:
    """``(line number from 1, decoded line without its line end)`` for a line-oriented text file, streamed.

    Line ends are ``\\n``, ``\\r\\n`` or ``\\r``.  A line of more than ``max_line_chars`` characters is left out and
    counted in ``stats`` (``stats.long_line_skip`` gives its Skip); no more than four bytes per character of it are
    ever held.  Raises :class:`InputError` for an unreadable, corrupt or binary file (lines before the error are good).
    Lines that are not UTF-8 are decoded as cp1252/Latin-1 and counted in ``stats.repaired``.
    """
    from data_prep.text_decoding import BINARY_SNIFF_BYTES, decode_line, looks_binary

    head, chunks = _sniffed(iter_bytes(path), BINARY_SNIFF_BYTES)
    if looks_binary(head):
        raise InputError(SkipReason.BINARY_FILE, "NUL or control bytes at the start")
    # UTF-8 takes at most 4 bytes a character: a line over 4x the bound in bytes is over it in characters.
    for number, raw in enumerate(iter_lines(lf_line_ends(chunks), 4 * max_line_chars), start=1):
        if isinstance(raw, LongLine):
            stats.count_long_line(number, raw.size)
            continue
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        line, repaired = decode_line(raw)
        if len(line) > max_line_chars:
            stats.count_long_line(number, len(raw))
            continue
        stats.repaired += repaired
        if not stats.content and not line.isspace() and line:
            stats.content = True
        yield number, line
