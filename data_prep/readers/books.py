"""One book per file (BooksCorpus / Project Gutenberg plain text) to ONE document of re-joined paragraphs.

Project Gutenberg boilerplate is stripped with our own line markers rather than a library: of the PyPI options,
``gutenberg`` (c-w, last release 2021) needs bsddb3/rdflib<5, ``gutenberg-cleaner`` (2019) needs nltk, and
``gutenbergpy`` (maintained) pulls in pymongo, lxml and chardet for a 60-line function; all three share one
algorithm that treats ~60 loose phrases ("Produced by", "The Project Gutenberg", "by Project Gutenberg",
"We need your donations more than ever!") within the first 600 lines as "the header ends here" and throws away
everything before them, which on a file whose header was already removed (as in our corpus) can eat the start
of the book.  We recognise only unambiguous markers, listed below, and count every file we strip.
"""
from __future__ import annotations

import re
from collections.abc import Iterator

from data_prep.documents import Document, Repair, Skip, SkipReason
from data_prep.readers._io import MAX_LINE_CHARS, InputError, LineStats, text_lines

# The header ends at (and includes) the last of these before the body:
#   "*** START OF THE PROJECT GUTENBERG EBOOK EMMA ***", "***START OF THIS PROJECT GUTENBERG EBOOK...",
#   the old small-print header's last line "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*".
_START = re.compile(r"^\s*\*{3}\s*START OF (?:THE|THIS) PROJECT GUTENBERG", re.IGNORECASE)
_SMALL_PRINT_END = re.compile(r"^\s*\*\s*END\s*\*?\s*THE SMALL PRINT", re.IGNORECASE)
# The footer starts at the first of these after the header:
#   "*** END OF THE PROJECT GUTENBERG EBOOK ... ***", "End of the Project Gutenberg EBook of Emma",
#   "End of Project Gutenberg's The Ball and The Cross", "END OF THIS PROJECT GUTENBERG ETEXT".
_END = re.compile(
    r"^\s*(?:\*{3}\s*END OF (?:THE|THIS) PROJECT GUTENBERG|END OF (?:THE |THIS )?PROJECT GUTENBERG)",
    re.IGNORECASE,
)
# An old small-print block at the end of a file without an "End of" line starts at
#   "***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN ETEXTS**START***".
_SMALL_PRINT_START = re.compile(r"^\s*\*+\s*START\s*\*+\s*THE SMALL PRINT", re.IGNORECASE)
# Producer credits just after a header ("Produced by Ben Crowder <...>"): dropped from the first paragraphs.
_CREDIT = re.compile(r"^(?:produced by|e-?text prepared by|this (?:e-?text|ebook) was (?:prepared|produced) by"
                     r"|transcribed (?:from .* )?by)\b", re.IGNORECASE)
_CREDIT_WINDOW = 5


def strip_gutenberg(text: str) -> tuple[str, str]:
    """Remove a Project Gutenberg header and footer; return the body and what was removed ('' for nothing).

    ``text`` has ``\\n`` line ends.  A small-print end marker counts as the end of a header only in the first
    half of the file and before any footer marker (our corpus has one at the very end of a footer).
    """
    lines = text.split("\n")
    first_end = next((i for i, line in enumerate(lines) if _END.match(line)), len(lines))
    header_end = -1
    for i in range(first_end):
        line = lines[i]
        if _START.match(line) or (i < len(lines) // 2 and _SMALL_PRINT_END.match(line)):
            header_end = i
    footer_start = next((i for i in range(header_end + 1, len(lines)) if _END.match(lines[i])), None)
    if footer_start is None:
        footer_start = next(
            (i for i in range(max(header_end + 1, len(lines) // 2), len(lines)) if _SMALL_PRINT_START.match(lines[i])),
            None,
        )
    removed = []
    if header_end >= 0:
        removed.append(f"header ({_lines(header_end + 1)})")
    if footer_start is not None:
        removed.append(f"footer ({_lines(len(lines) - footer_start - (lines[-1] == ''))})")
    else:
        footer_start = len(lines)
    body = lines[header_end + 1:footer_start]
    if header_end >= 0:
        body = _drop_credits(body)
    return "\n".join(body), ", ".join(removed)


def _lines(n: int) -> str:
    return f"{n} line" if n == 1 else f"{n} lines"


def _drop_credits(lines: list[str]) -> list[str]:
    """Drop producer-credit paragraphs among the first few paragraphs after a header."""
    out: list[str] = []
    paragraphs_seen = 0
    skipping = False
    previous_blank = True
    for i, line in enumerate(lines):
        blank = not line.strip()
        if not blank and previous_blank:
            paragraphs_seen += 1
            skipping = paragraphs_seen <= _CREDIT_WINDOW and bool(_CREDIT.match(line.strip()))
            if paragraphs_seen > _CREDIT_WINDOW:
                return out + lines[i:]
        if not skipping:
            out.append(line)
        previous_blank = blank
    return out


# Headings are dropped (they are not sentences, and as NSP "sentences" they only teach that "CHAPTER XII" may
# follow anything).  A heading is a paragraph of ONE source line that is:
#   * a bracketed note: "[Emma by Jane Austen 1816]", "[Illustration]";
#   * short (<= 80 characters) with no lower-case letter and not opening with a quote: "VOLUME I", "CHAPTER I",
#     "I. A DISCUSSION SOMEWHAT IN THE AIR", "THE END", "***" (a quoted shout like '"HELP!"' is dialogue: kept);
#   * "Chapter 1", "Book the First", "Part II.", "Volume III", "Finis", "The End";
#   * a Roman-numbered title that is not a sentence: "I. The Absence of Mr Glass".
_BRACKETED = re.compile(r"^\[[^\[\]]*\]$")
_NUMBERED_HEADING = re.compile(
    r"^(?:chapter|volume|book|part|canto|section)\s+(?:[ivxlcdm]+|\d+|the\s+\w+|[a-z]+)\s*[.:]?$"
    r"|^(?:finis|the end)\s*\.?$"
    r"|(?-i:^[IVXLCDM]+\.\s+[^.!?]*$)",
    re.IGNORECASE,
)
_HEADING_MAX_CHARS = 80
_QUOTES = "\"'“‘«`"


def _is_heading(line: str) -> bool:
    if _BRACKETED.match(line) or (len(line) <= _HEADING_MAX_CHARS and _NUMBERED_HEADING.match(line)):
        return True
    return len(line) <= _HEADING_MAX_CHARS and not any(ch.islower() for ch in line) and line[0] not in _QUOTES


def book_paragraphs(text: str) -> tuple[str, ...]:
    """Re-join wrapped lines: a blank line ends a paragraph, lines within one are joined with a space.

    Runs of white space become one space; a line ending in a Gutenberg dash "--" is joined without a space
    ("birth--" + '"Married' -> 'birth--"Married').  One-line headings are dropped (see ``_is_heading``).
    """
    paragraphs: list[str] = []
    current: list[str] = []

    def end_paragraph() -> None:
        if not current:
            return
        if len(current) == 1 and _is_heading(current[0]):
            current.clear()
            return
        joined = "\n".join(current).replace("--\n", "--")
        paragraphs.append(" ".join(joined.split()))
        current.clear()

    for line in text.split("\n"):
        stripped = line.strip()
        if stripped:
            current.append(stripped)
        else:
            end_paragraph()
    end_paragraph()
    return tuple(paragraphs)


def read_book(path: str, source_name: str, max_line_chars: int = MAX_LINE_CHARS) -> Iterator[Document | Skip]:
    """One Document (key ``<source_name>:0``) for the whole book, plus its repair/skip records.

    Read line by line: a line over ``max_line_chars`` is left out and counted, never held. A file the input breaks
    off in (unreadable, corrupt compression) gives nothing but its Skip. Never raises on bad input.
    """
    stats = LineStats()
    try:
        text = "".join(line + "\n" for _, line in text_lines(path, stats, max_line_chars))
    except InputError as error:
        yield Skip(error.reason.value, source_name, detail=error.detail)
        return
    if long_lines := stats.long_line_skip(source_name, max_line_chars):
        yield long_lines
    if not stats.content:
        yield Skip(SkipReason.EMPTY_FILE.value, source_name)
        return
    text, removed = strip_gutenberg(text)
    if stats.repaired:
        yield Skip(Repair.NON_UTF8_LINES.value, source_name, count=stats.repaired)
    if removed:
        yield Skip(Repair.GUTENBERG_BOILERPLATE.value, source_name, detail=removed)
    paragraphs = book_paragraphs(text)
    if not paragraphs:
        yield Skip(SkipReason.EMPTY_DOCUMENT.value, source_name)
        return
    yield Document(f"{source_name}:0", paragraphs, presplit=False)
