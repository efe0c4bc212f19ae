"""Input files' stable names (their documents' identity): inputs whose files share relative names get distinct
names (two WikiExtractor runs, each with AA/wiki_00), inputs that never collided keep their plain names."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from data_prep.config import InputSpec
from data_prep.plan import InputError, expand_inputs, source_names
from data_prep.run import run

IN_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]


def test_plain_names_where_nothing_collides():
    names = source_names([("/data/a", ["/data/a/x.txt", "/data/a/AA/wiki_00"]), ("/data/b", ["/data/b/y.txt"])])
    assert names == {"/data/a/x.txt": "x.txt", "/data/a/AA/wiki_00": "AA/wiki_00", "/data/b/y.txt": "y.txt"}


def test_colliding_inputs_are_named_below_what_tells_their_bases_apart():
    names = source_names([
        ("/corpora/enwiki", ["/corpora/enwiki/AA/wiki_00", "/corpora/enwiki/AA/wiki_01"]),
        ("/corpora/simplewiki", ["/corpora/simplewiki/AA/wiki_00"]),
        ("/corpora/books", ["/corpora/books/emma.txt"]),
    ])
    assert names == {"/corpora/enwiki/AA/wiki_00": "enwiki/AA/wiki_00",
                     "/corpora/enwiki/AA/wiki_01": "enwiki/AA/wiki_01",   # every file of a colliding input
                     "/corpora/simplewiki/AA/wiki_00": "simplewiki/AA/wiki_00",
                     "/corpora/books/emma.txt": "emma.txt"}               # an input that collided with nothing
    deeper = source_names([("/x/enwiki/", ["/x/enwiki/00003.txt.gz"]), ("/y/enwiki/", ["/y/enwiki/00003.txt.gz"]),
                           ("gs://bucket/enwiki/", ["gs://bucket/enwiki/00003.txt.gz"])])
    assert sorted(deeper.values()) == ["bucket/enwiki/00003.txt.gz", "x/enwiki/00003.txt.gz", "y/enwiki/00003.txt.gz"]


def test_a_qualified_name_meeting_a_plain_one_is_refused_saying_what_to_do():
    with pytest.raises(InputError, match="directories with distinct names"):
        source_names([("/a/wiki", ["/a/wiki/x"]), ("/b/wiki", ["/b/wiki/x"]), ("/c", ["/c/a/wiki/x"])])


def test_two_wikiextractor_runs_with_the_same_file_names_prepare_together(tmp_path: Path, shared_data: Path):
    extracted = shared_data / "corpora" / "wikipedia_extracted" / "AA"
    for run_name, files in (("enwiki", ("wiki_00.bz2", "wiki_01.bz2")), ("simplewiki", ("wiki_00.bz2",))):
        (tmp_path / run_name / "AA").mkdir(parents=True)
        for name in files:
            shutil.copy(extracted / name, tmp_path / run_name / "AA" / name)
    planned = expand_inputs((InputSpec(f"{tmp_path}/enwiki/"), InputSpec(f"{tmp_path}/simplewiki/")))
    assert [(f.source_name, f.format) for f in planned] == [
        ("enwiki/AA/wiki_00.bz2", "wikiextractor"), ("enwiki/AA/wiki_01.bz2", "wikiextractor"),
        ("simplewiki/AA/wiki_00.bz2", "wikiextractor")]
    both = run([f"inputs=[{tmp_path}/enwiki/, {tmp_path}/simplewiki/]", f"output_dir={tmp_path / 'both'}",
                "preset=phase1", "num_shards=2", "dupe_factor=1", *IN_PROCESS])
    alone = run([f"inputs=[{tmp_path}/simplewiki/]", f"output_dir={tmp_path / 'alone'}",
                 "preset=phase1", "num_shards=1", "dupe_factor=1", *IN_PROCESS])
    enwiki_00 = run([f"inputs=[{tmp_path}/enwiki/AA/wiki_00.bz2]", f"output_dir={tmp_path / 'one'}",
                     "preset=phase1", "num_shards=1", "dupe_factor=1", *IN_PROCESS])
    # simplewiki's wiki_00 is a copy of enwiki's: both are read, as distinct documents
    assert both["totals"]["documents"] == alone["totals"]["documents"] + enwiki_00["totals"]["documents"] \
        + run([f"inputs=[{tmp_path}/enwiki/AA/wiki_01.bz2]", f"output_dir={tmp_path / 'two'}", "preset=phase1",
               "num_shards=1", "dupe_factor=1", *IN_PROCESS])["totals"]["documents"]
    assert [i["source_name"] for i in both["inputs"]] == [f.source_name for f in planned]
