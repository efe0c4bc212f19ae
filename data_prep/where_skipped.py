"""Which input files the skips came from: the counts by reason alone do not say which file to look at.

Each input file's skips are summed by reason, with the first one's detail ("line 2 longer than max_line_chars=...");
the manifest keeps, per reason, how many files had any and the first few of them by name, so it stays small
whatever the corpus; the end-of-job summary and the no-instance error name the files of the input problems.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from data_prep.documents import INPUT_PROBLEMS, Repair, Skip

LISTED_FILES = 10
"""Files listed per reason in the manifest (the number of files with that reason is always there)."""

_REPAIRS = {repair.value for repair in Repair}

SkipNote = tuple[str, str, int, str]
"""(reason, input file's source name, skips of that reason in it, the first one's detail): plain, for Beam to pass."""


class FileSkips:
    """The skips of one input file, by reason: how many, and the first one's detail (repairs are not skips)."""

    def __init__(self, source_name: str):
        self.source_name = source_name
        self.by_reason: dict[str, list] = {}

    def add(self, skip: Skip) -> None:
        if skip.reason in _REPAIRS:
            return
        entry = self.by_reason.setdefault(skip.reason, [0, skip.detail])
        entry[0] += skip.count

    def notes(self) -> list[SkipNote]:
        return [(reason, self.source_name, count, detail) for reason, (count, detail) in sorted(self.by_reason.items())]


def skipped_where(notes: Iterable[SkipNote]) -> dict[str, dict]:
    """The manifest's section: per reason, the number of files with such skips and the first LISTED_FILES by name."""
    by_reason: dict[str, list[dict]] = {}
    for reason, source, count, detail in notes:
        by_reason.setdefault(reason, []).append({"file": source, "count": count, "detail": detail})
    return {reason: {"files": len(entries), "listed": sorted(entries, key=lambda e: e["file"])[:LISTED_FILES]}
            for reason, entries in sorted(by_reason.items())}


def input_problem_lines(where: dict[str, dict]) -> Iterator[str]:
    """One line per input problem (documents.INPUT_PROBLEMS) naming its files, e.g. 'binary_file in 2 files: a.bin,
    b.bin'."""
    for reason, entry in where.items():
        if reason not in INPUT_PROBLEMS:
            continue
        named = ", ".join(e["file"] + (f" ({e['detail']})" if e["detail"] else "") for e in entry["listed"])
        more = entry["files"] - len(entry["listed"])
        files = "1 file" if entry["files"] == 1 else f"{entry['files']:,} files"
        yield f"{reason} in {files}: {named}" + (f" and {more:,} more" if more else "")
