"""Small real shard sets, made by the real data_prep job from a few Gutenberg books (paths the caller takes from the
shared data: the tests' shared_data fixture, a benchmark's --shared-data): for tests and benchmarks."""
from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

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


def cached_books_set(root: str | Path, name: str, books: Iterable[str | Path], *overrides: str) -> Path:
    """build_books_set into root/name unless a finished set is already there (tests share one per session)."""
    output_dir = Path(root) / name
    if not (output_dir / "manifest.json").exists():
        build_books_set(output_dir, books, *overrides)
    return output_dir
