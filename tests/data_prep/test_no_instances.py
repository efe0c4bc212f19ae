"""Inputs that give no instance (empty files, binary files, an empty directory) fail the real command, saying which
inputs and files and why, and leave nothing that reads as a shard set."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from data_prep.no_instances import write_no_instances_report

REPO_ROOT = Path(__file__).resolve().parents[2]


def data_prep(inputs: Path, out: Path) -> subprocess.CompletedProcess:
    """`python data_prep/run.py` as a user runs it, on one worker process (the inputs are a few bytes)."""
    command = [sys.executable, "data_prep/run.py", "preset=phase1", f"inputs=[{inputs}]", f"output_dir={out}",
               "--direct_num_workers=1"]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAYON_NUM_THREADS": "1"})


def nothing_like_a_shard_set(out: Path) -> bool:
    return not (out / "manifest.json").exists() and not list(out.glob("shard-*"))


CORPORA = {
    "empty_files": ({"empty.txt": b"", "blank.txt": b" \n\t\r\n", "empty.jsonl": b""},
                    "3 files read, no document; skipped: empty_file: 3",
                    "empty_file in 3 files: blank.txt, empty.jsonl, empty.txt"),
    "binary_files": ({"photo.jpg": b"\xff\xd8\xff\xe0\x00\x10JFIF" + bytes(range(256)) * 4,
                      "archive.txt": b"PK\x03\x04\x14\x00\x00\x00" + bytes(256)},
                     "2 files read, no document; skipped: binary_file: 2",
                     "binary_file in 2 files: archive.txt (NUL or control bytes at the start), photo.jpg (NUL or "
                     "control bytes at the start)"),
}


@pytest.mark.parametrize("corpus", sorted(CORPORA))
def test_inputs_without_text_fail_naming_the_inputs_files_and_reasons(tmp_path: Path, corpus: str):
    files, counts, named = CORPORA[corpus]
    inputs, out = tmp_path / corpus, tmp_path / "shards"
    inputs.mkdir()
    for name, content in files.items():
        (inputs / name).write_bytes(content)
    result = data_prep(inputs, out)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert f"data_prep: error: no training instance made from inputs ['{inputs}']: {counts}" in result.stderr
    assert named in result.stderr
    assert f"No shard set was written (no manifest.json in {out})" in result.stderr
    assert "instances" not in result.stdout   # no summary of a set that is not there
    assert nothing_like_a_shard_set(out)
    report = json.loads((out / "no_instances.json").read_text())
    assert report["totals"]["files"] == len(files) and report["totals"]["documents"] == 0


def test_an_empty_directory_fails_before_the_job_starts(tmp_path: Path):
    (tmp_path / "corpus").mkdir()
    result = data_prep(tmp_path / "corpus", tmp_path / "shards")
    assert result.returncode == 2
    assert f"data_prep: error: input '{tmp_path / 'corpus'}' matched no files" in result.stderr
    assert nothing_like_a_shard_set(tmp_path / "shards")


def test_the_report_removes_shard_files_of_no_rows(tmp_path: Path):
    # Every document makes an instance in practice; should one day none do, their empty shards go with the manifest.
    (tmp_path / "shard-00000-of-00001.parquet").write_bytes(b"PAR1")
    plan = types.SimpleNamespace(config=types.SimpleNamespace(output_dir=str(tmp_path), inputs=[]))
    shards = [{"index": 0, "rows": 0, "files": {"parquet": {"path": "shard-00000-of-00001.parquet"}}}]
    write_no_instances_report(shards, plan, {"files": 1, "documents": 1}, [])
    assert nothing_like_a_shard_set(tmp_path)
    assert json.loads((tmp_path / "no_instances.json").read_text())["totals"]["documents"] == 1
