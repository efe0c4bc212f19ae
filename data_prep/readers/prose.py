"""Which lines of extracted Wikipedia text read as prose (the "debris" rule), for both Wikipedia readers.

After the markup is gone, a line is kept when it reads as prose:
 * a line with no letter or digit (a list marker, a stray bracket, "*", "|") is dropped;
 * a list/indent item (``*``, ``#``, ``;``, ``:``) is kept only if it is a sentence: >= 5 words and ending in
   . ! ? (lists in articles are mostly "See also" links, discographies, name lists: not sentence material);
 * any other line is kept if it has >= 4 words, or >= 2 words and ends like a sentence; shorter lines are
   the remains of captions, navigation and removed templates ("Notes", "1 2 3", "Main article:").
"""
from __future__ import annotations

import re

LIST_MIN_WORDS = 5
LINE_MIN_WORDS = 4
SENTENCE_MIN_WORDS = 2
_SENTENCE_END = re.compile(r"[.!?…][\"'”’»)\]]*$")


def has_text(line: str) -> bool:
    return any(ch.isalnum() for ch in line)


def is_sentence_like(line: str, words: int, min_words: int) -> bool:
    return words >= min_words and bool(_SENTENCE_END.search(line[-20:]))


def is_prose_line(line: str, words: int) -> bool:
    """A line that is not a list item and is kept (see the module's rule); `line` has text (has_text)."""
    return words >= LINE_MIN_WORDS or is_sentence_like(line, words, SENTENCE_MIN_WORDS)


def is_prose_list_item(line: str, words: int) -> bool:
    return is_sentence_like(line, words, LIST_MIN_WORDS)
