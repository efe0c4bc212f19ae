"""Cache keys of the `datasets` maps that read and featurize task data.

`datasets` fingerprints a map by the state of the objects it is given, not by the code of their classes or of the
functions they call, so a change to how rows are read or featurized would silently reuse an old cache. Every key
therefore includes a digest of the modules that make the rows.
"""
from __future__ import annotations

import hashlib
from pathlib import Path


def code_digest(*module_files: str | Path) -> str:
    """A digest of these source files (pass `__file__` of each module whose code shapes the rows)."""
    digest = hashlib.sha256()
    for module_file in module_files:
        digest.update(Path(module_file).read_bytes())
    return digest.hexdigest()[:16]


def cache_key(*parts: object) -> str:
    """A map's new_fingerprint from everything that shapes its output (input fingerprint, settings, code digest)."""
    return hashlib.sha256("|".join(str(part) for part in parts).encode()).hexdigest()[:16]
