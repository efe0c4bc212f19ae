"""What the readers hand to the rest of the job: documents, and counted reasons for what they skip."""
from __future__ import annotations

import dataclasses
import enum


class SkipReason(str, enum.Enum):
    """Why input did not become a document. Each is counted in Beam metrics and in the manifest."""

    EMPTY_FILE = "empty_file"                    # a file with no bytes, or only white space
    BINARY_FILE = "binary_file"                  # NUL bytes or mostly non-text: not a text file
    UNREADABLE_FILE = "unreadable_file"          # the file could not be opened or read at all
    CORRUPT_COMPRESSION = "corrupt_compression"  # a .bz2 stream broke off; documents before the break are kept
    MALFORMED_XML = "malformed_xml"              # XML ended or broke mid-dump; pages before the break are kept
    MALFORMED_RECORD = "malformed_record"        # a JSONL line that is not JSON, or a row without the text column
    REDIRECT = "redirect"                        # a Wikipedia redirect page
    NON_ARTICLE_NAMESPACE = "non_article_namespace"  # a Wikipedia page outside namespace 0 (Talk:, User:, ...)
    EMPTY_DOCUMENT = "empty_document"            # nothing left after cleaning
    DISAMBIGUATION = "disambiguation"            # a Wikipedia page that only lists other pages ("X may refer to:")
    NO_TOKENS = "no_tokens"                      # text that tokenizes to nothing (counted by the tokenizing step)
    LINE_TOO_LONG = "line_too_long"              # a line of more than max_line_chars characters: not read
    SENTENCE_TOO_LONG = "sentence_too_long"      # a sentence (joined from shorter lines) over max_line_chars: not
                                                 # tokenized (counted by the tokenizing step)


INPUT_PROBLEMS = frozenset(reason.value for reason in (
    SkipReason.EMPTY_FILE, SkipReason.BINARY_FILE, SkipReason.UNREADABLE_FILE, SkipReason.CORRUPT_COMPRESSION,
    SkipReason.MALFORMED_XML, SkipReason.MALFORMED_RECORD, SkipReason.LINE_TOO_LONG, SkipReason.SENTENCE_TOO_LONG,
))
"""The reasons that say an input file is not what it should be (the others filter content): the end-of-job summary
names the files they come from."""


class Repair(str, enum.Enum):
    """Input that was kept after a fix; counted so that nothing changes silently."""

    NON_UTF8_LINES = "non_utf8_lines_decoded_as_cp1252"
    GUTENBERG_BOILERPLATE = "gutenberg_boilerplate_removed"


@dataclasses.dataclass(frozen=True)
class Document:
    """One document of the corpus, cleaned.

    key: stable identity, ``"<source name>:<ordinal in that source>"``; every random choice made for this
         document is seeded from it, so it must not depend on arrival order or on where the corpus lies.
    paragraphs: clean blocks of running text, each to be split into sentences.
    presplit: True for the reference's own input format, where each entry is already one sentence.
    title: the article's title where the input has one (Wikipedia); metadata only, never part of the text.
    """

    key: str
    paragraphs: tuple[str, ...]
    presplit: bool = False
    title: str = dataclasses.field(default="", compare=False)


@dataclasses.dataclass(frozen=True)
class Skip:
    """Something a reader left out (or repaired, with a Repair reason), with how many and where."""

    reason: str
    source: str
    count: int = 1
    detail: str = ""
