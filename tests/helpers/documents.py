"""Reading data_prep's readers' output in tests: the documents and the counted skips of one input."""
from __future__ import annotations

import collections
from pathlib import Path

from data_prep.documents import Document, Skip
from data_prep.readers import read_documents


def read(path: Path | str, fmt: str, source: str = "src", **kwargs) -> list[Document | Skip]:
    return list(read_documents(str(path), fmt, source, **kwargs))


def documents(items) -> list[Document]:
    return [item for item in items if isinstance(item, Document)]


def skips(items, reason: str | None = None) -> list[Skip]:
    return [item for item in items if isinstance(item, Skip) and (reason is None or item.reason == reason)]


def reasons(items) -> collections.Counter:
    return collections.Counter(item.reason for item in items if isinstance(item, Skip))


def assert_keys(items, source: str) -> None:
    assert [d.key for d in documents(items)] == [f"{source}:{i}" for i in range(len(documents(items)))]
