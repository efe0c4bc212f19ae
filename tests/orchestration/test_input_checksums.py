"""The workflow's inputs from outside it count by content, hashed once and cached (<root>/_workflow/checksums.json):
a file rewritten in place with its size and mtime put back (`cp -p` or `rsync -a` of a bad copy; os.utime here) is
hashed again, its ctime having moved, and changes the identity of the stage that reads it; workflow.rehash_inputs=true
hashes every input again whatever the cache says."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from pipeline.orchestration.stage_config import stage_specs
from pipeline.orchestration.workflow_config import load_workflow

REPO_ROOT = Path(__file__).resolve().parents[2]


def identities(root: Path, vocab: Path, *overrides: str) -> dict[str, str]:
    prep = ("workflow.stages.prep_phase1.overrides=['preset=sample','dupe_factor=1','num_shards=2',"
            f"'vocab.file={vocab}']")
    wf = load_workflow(["+workflow=tiny", f"workflow.root={root}", prep, *overrides])
    return {name: spec.identity for name, spec in stage_specs(wf, check_shapes=False).items()}


def rewrite_keeping_size_and_mtime(path: Path, old: bytes, new: bytes) -> None:
    before = path.stat()
    path.write_bytes(path.read_bytes().replace(old, new, 1))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_an_input_rewritten_with_its_size_and_mtime_kept_changes_its_stage(tmp_path):
    vocab = Path(shutil.copy(REPO_ROOT / "data_prep" / "vocab" / "bert-base-uncased-vocab.txt", tmp_path / "vocab.txt"))
    root = tmp_path / "wf"
    base = identities(root, vocab)                        # hashed and cached
    rewrite_keeping_size_and_mtime(vocab, b"[unused1]", b"[unused9]")
    changed = identities(root, vocab)
    assert {name for name in base if changed[name] != base[name]} == {"prep_phase1"}


def test_rehash_inputs_ignores_the_cache(tmp_path):
    vocab = Path(shutil.copy(REPO_ROOT / "data_prep" / "vocab" / "bert-base-uncased-vocab.txt", tmp_path / "vocab.txt"))
    root = tmp_path / "wf"
    truth = identities(root, vocab)
    cache_file = root / "_workflow" / "checksums.json"
    cache = json.loads(cache_file.read_text())
    cache[os.path.realpath(vocab)]["sha256"] = "0" * 64   # a cache that cannot be trusted (e.g. restored with the data)
    cache_file.write_text(json.dumps(cache))
    assert identities(root, vocab)["prep_phase1"] != truth["prep_phase1"]          # the cache is trusted by default
    assert identities(root, vocab, "workflow.rehash_inputs=true") == truth
    assert json.loads(cache_file.read_text())[os.path.realpath(vocab)]["sha256"] != "0" * 64   # and written anew
