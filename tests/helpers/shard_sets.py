"""Small real shard sets, made by the real data_prep job from a few Gutenberg books (paths the caller takes from the
shared data: the tests' shared_data fixture, a benchmark's --shared-data): for tests and benchmarks."""
from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from tests.helpers.shared_builds import built_once

SMALL_BOOKS = ("chesterton-thursday.txt", "chesterton-brown.txt")   # of the shared books, the two shortest: ~1,500 rows


def build_books_set(output_dir: str | Path, books: Iterable[str | Path], *overrides: str) -> dict:
    """Run data_prep (preset phase1, 3 shards, dupe_factor 1, in-process Beam) on copies of `books`.

    `overrides` are further data_prep options, e.g. "masking=dynamic". Returns the manifest.
    """
    from data_prep.run import run  # Apache Beam: only when a set is actually built
    output_dir = Path(output_dir)
    inputs = output_dir.parent / f"{output_dir.name}-books"
    inputs.mkdir(parents=True, exist_ok=True)
    for book in books:
        shutil.copy(book, inputs / Path(book).name)
    return run([f"inputs=[{{path: '{inputs}/*.txt', format: books}}]", f"output_dir={output_dir}", "preset=phase1",
                "num_shards=3", "dupe_factor=1", *overrides,
                "--runner=DirectRunner", "--direct_running_mode=in_memory"])


def shared_books_set(tmp_path_factory, name: str, books: Iterable[str | Path], *overrides: str) -> Path:
    """build_books_set, once for the whole test run (the workers of a pytest-xdist run together: shared_builds.py)."""
    books = [Path(book) for book in books]
    return built_once(tmp_path_factory, f"books-{name}", [[str(book) for book in books], list(overrides)],
                      lambda out: build_books_set(out, books, *overrides), leaf=name)
