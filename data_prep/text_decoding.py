"""Bytes to text for the readers: UTF-8 first, legacy 8-bit encodings only for the lines that need them.

Corpora gathered from the web and from old e-text archives are mostly UTF-8 with the odd line in
Windows-1252 or Latin-1 (an accented name typed on an old machine).  Decoding the whole file as cp1252
would garble every correct UTF-8 character, and ``errors="replace"`` would lose the letter; so each line
that is not valid UTF-8 is decoded on its own as cp1252, and the five bytes cp1252 leaves undefined
(0x81, 0x8D, 0x8F, 0x90, 0x9D) as Latin-1.  The caller counts the repaired lines.
"""
from __future__ import annotations

import codecs

__all__ = ["decode_text", "decode_line", "looks_binary", "BINARY_SNIFF_BYTES"]

BINARY_SNIFF_BYTES = 8192
"""How much of the start of a file :func:`looks_binary` looks at."""

_CONTROL_SHARE_LIMIT = 0.10
"""More than this share of control bytes in the head of a file means it is not text."""

_ERROR_HANDLER = "data_prep.latin1_fallback"


def _latin1_fallback(error: UnicodeError) -> tuple[str, int]:
    """cp1252 leaves five bytes undefined; read them as Latin-1 (the C1 control characters)."""
    if not isinstance(error, UnicodeDecodeError):
        raise error
    return error.object[error.start:error.end].decode("latin-1"), error.end


codecs.register_error(_ERROR_HANDLER, _latin1_fallback)

# Control bytes that do not occur in text files: everything below 0x20 except \t \n \v \f \r and ESC (ANSI
# colour codes in logs), plus DEL.
_CONTROL_BYTES = bytes(b for b in range(0x20) if b not in b"\t\n\x0b\x0c\r\x1b") + b"\x7f"


def decode_line(raw: bytes) -> tuple[str, bool]:
    """Decode one line (or any piece of text that has no line break in it).

    Returns the text and whether it had to be repaired (it was not valid UTF-8 and was read as cp1252,
    with Latin-1 for the bytes cp1252 cannot map).  Never raises.
    """
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors=_ERROR_HANDLER), True


def decode_text(raw: bytes) -> tuple[str, int]:
    """Decode a whole text: UTF-8 (a leading byte-order mark is dropped), line by line fallback.

    Returns ``(text, repaired_lines)``.  When the whole text is valid UTF-8 it is decoded in one call; otherwise
    it is split into lines (at ``\\n``, ``\\r\\n`` and ``\\r``, which are kept, so the text is the same length in
    lines) and each line that is not valid UTF-8 is decoded as cp1252/Latin-1 and counted.  Linear in the size
    of the input, whatever the length of the lines.  Never raises.
    """
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
    try:
        return raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        pass
    parts: list[str] = []
    repaired = 0
    good_run: list[bytes] = []  # consecutive valid lines, decoded together
    for line in raw.splitlines(keepends=True):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            if good_run:
                parts.append(b"".join(good_run).decode("utf-8"))
                good_run = []
            parts.append(line.decode("cp1252", errors=_ERROR_HANDLER))
            repaired += 1
        else:
            good_run.append(line)
    if good_run:
        parts.append(b"".join(good_run).decode("utf-8"))
    return "".join(parts), repaired


def looks_binary(raw_head: bytes) -> bool:
    """Whether the start of a file says it is not text: a NUL byte, or more than 10% control bytes.

    Only the first :data:`BINARY_SNIFF_BYTES` bytes are looked at.  Bytes of 0x80 and above are not counted
    against the file: they are UTF-8 or a legacy 8-bit encoding, which :func:`decode_text` handles.
    (UTF-16 text has NUL bytes and so counts as binary; no corpus we read is UTF-16.)
    """
    head = raw_head[:BINARY_SNIFF_BYTES]
    if not head:
        return False
    if b"\x00" in head:
        return True
    controls = len(head) - len(head.translate(None, _CONTROL_BYTES))
    return controls > _CONTROL_SHARE_LIMIT * len(head)
