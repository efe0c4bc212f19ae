"""manifest.json is written whole (issue 49, item 13): a data prep killed while writing it leaves the earlier manifest,
and a manifest that is there but cut off (written by the code before, or copied in part) is refused naming the file
and saying to re-run data prep, not with a bare JSONDecodeError."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from data_prep.manifest import read_manifest

EARLIER = {"format_version": 3, "parameters": {"max_seq_length": 128}, "shards": []}

# The job's last step, killed (SIGKILL: no cleanup runs) once the manifest's bytes are being made.
_KILLED_WHILE_WRITING = """
import os, signal, sys, types
import data_prep.manifest_writer as writer
writer.build_manifest = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
writer.write_manifest([], types.SimpleNamespace(config=types.SimpleNamespace(output_dir=sys.argv[1])), {})
"""


def test_a_data_prep_killed_while_writing_the_manifest_leaves_the_earlier_one(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(EARLIER))
    killed = subprocess.run([sys.executable, "-c", _KILLED_WHILE_WRITING, str(tmp_path)], timeout=120)
    assert killed.returncode == -signal.SIGKILL
    assert read_manifest(str(tmp_path)) == EARLIER


@pytest.mark.parametrize("content", [json.dumps(EARLIER, indent=2)[:40], "", "[1, 2]", "\udcff"],
                         ids=["cut-off", "empty", "not-an-object", "not-utf8"])
def test_a_cut_off_manifest_is_refused_naming_it_and_saying_to_re_run_data_prep(tmp_path, content):
    (tmp_path / "manifest.json").write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(ValueError, match=rf"{tmp_path / 'manifest.json'} is not a whole manifest .*Re-run data "
                                         rf"prep into it \(python data_prep/run.py ... output_dir={tmp_path}\)"):
        read_manifest(str(tmp_path))
