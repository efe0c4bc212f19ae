"""google-research/bert's own input format: one sentence per line, a blank line between documents.

Streamed line by line; each document becomes ``Document(presplit=True)`` whose paragraphs are its sentences,
stripped, as ``create_pretraining_data.py`` reads them (runs of blank lines make no empty documents).
"""
from __future__ import annotations

from collections.abc import Iterator

from data_prep.documents import Document, Skip, SkipReason
from data_prep.readers._io import MAX_LINE_CHARS, InputError, LineStats, text_lines


def read_sentences(path: str, source_name: str, max_line_chars: int = MAX_LINE_CHARS) -> Iterator[Document | Skip]:
    """Documents (presplit) and skips from a sentence-per-line file; never raises on bad input.  A line over
    ``max_line_chars`` is left out of its document and counted."""
    stats = LineStats()
    ordinal = 0
    sentences: list[str] = []
    try:
        for _, line in text_lines(path, stats, max_line_chars):
            sentence = line.strip()
            if sentence:
                sentences.append(sentence)
            elif sentences:
                yield Document(f"{source_name}:{ordinal}", tuple(sentences), presplit=True)
                ordinal += 1
                sentences = []
    except InputError as error:
        # the document the error cut off is not yielded half; the ones before it are kept
        yield Skip(error.reason.value, source_name, detail=f"{error.detail} (after {ordinal} documents)")
    else:
        if sentences:
            yield Document(f"{source_name}:{ordinal}", tuple(sentences), presplit=True)
        elif not stats.content:
            yield Skip(SkipReason.EMPTY_FILE.value, source_name)
    yield from stats.closing_skips(source_name, max_line_chars)
