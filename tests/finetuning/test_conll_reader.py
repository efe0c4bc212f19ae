"""CoNLL-2003 reader: the hand-written fixtures (tests/finetuning/fixtures/conll2003/, the same eight sentences in IOB1
and IOB2), scheme detection and configuration, -DOCSTART- documents, and malformed files stopping at their line."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

# Never the network; no progress bars in the test log.  Set before `datasets` is imported.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import pytest  # noqa: E402

from pipeline.finetuning.tasks import TASKS, get_task  # noqa: E402
from pipeline.finetuning.tasks.conll import CONLL2003, LABELS, parse_conll, read_conll, to_iob2  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "conll2003"
IOB1_FILE = FIXTURES / "eng.train"
IOB2_FILE = FIXTURES / "train.txt"

# The fixture's sentences in IOB2, written out by hand (not derived from either file).
EXPECTED = [
    (0, "Kowalczyk wins Thessaloniki marathon .", "B-PER O B-LOC O O"),
    (0, "THESSALONIKI 1996-10-06", "B-LOC O"),
    (0, "Polish runner Marek Kowalczyk won the Thessaloniki marathon on Sunday , beating Kenya 's Joseph Kiprotich "
        "by 40 seconds .",
     "B-MISC O B-PER I-PER O O B-LOC O O O O O B-LOC O B-PER I-PER O O O O"),
    (0, "Kiprotich 's manager said the Kenyan Ethiopian rivalry would go on .",
     "B-PER O O O O B-MISC B-MISC O O O O O"),                       # adjacent MISC: I-MISC B-MISC in IOB1
    (1, "SOCCER - AJAX PSV DRAW IN EINDHOVEN .", "O O B-ORG B-ORG O O B-LOC O"),   # adjacent ORG: I-ORG B-ORG
    (1, "EINDHOVEN , Netherlands 1996-10-06", "B-LOC O B-LOC O"),
    (1, "PSV Eindhoven and Ajax Amsterdam drew 1-1 in the Dutch first division on Sunday .",
     "B-ORG I-ORG O B-ORG I-ORG O O O O B-MISC O O O O O"),
    (1, "Belgian PSV striker Pieter de Wit scored after Arjen Vos had given Ajax the lead .",
     "B-MISC B-ORG O B-PER I-PER I-PER O O B-PER I-PER O O B-ORG O O O"),   # MISC then ORG: I-MISC I-ORG in IOB1
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hf_datasets_cache")


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# -- the two encodings -------------------------------------------------------------------------------------------


def test_both_encodings_give_the_same_iob2_labels():
    iob1, iob2 = parse_conll(IOB1_FILE), parse_conll(IOB2_FILE)
    expected_words = [text.split(" ") for _, text, _ in EXPECTED]
    expected_labels = [tags.split(" ") for _, _, tags in EXPECTED]
    for parsed in (iob1, iob2):
        assert parsed.words == expected_words
        assert parsed.labels == expected_labels
        assert parsed.doc_index == [doc for doc, _, _ in EXPECTED] and parsed.documents == 2
        assert all(label in LABELS for sentence in parsed.labels for label in sentence)


def test_scheme_detection():
    iob1 = parse_conll(IOB1_FILE)
    # 24 entities, two of them (Ethiopian, PSV in the headline) after one of the same type: B- in IOB1 too, so 22
    # entities start with I-
    assert (iob1.scheme, iob1.entity_starting_i_tags) == ("iob1", 22)
    iob2 = parse_conll(IOB2_FILE)
    assert (iob2.scheme, iob2.entity_starting_i_tags) == ("iob2", 0)


def test_configured_scheme(tmp_path):
    # IOB2 refuses an I- that starts an entity, at its line: line 3 is "Kowalczyk NNP I-NP I-PER"
    with pytest.raises(ValueError, match=r"eng\.train, line 3: I-PER starts an entity \(first in its sentence\).*"
                                         r"scheme='iob1' or 'auto'"):
        parse_conll(IOB1_FILE, scheme="iob2")
    later = write(tmp_path / "later.txt",
                  "EU NNP B-NP B-ORG\nsays VBZ B-VP O\n\nThe DT B-NP O\nGerman JJ I-NP I-MISC\n")
    with pytest.raises(ValueError, match=r"later\.txt, line 5: I-MISC starts an entity \(after O\)"):
        parse_conll(later, scheme="iob2")
    after_other_type = write(tmp_path / "types.txt", "Belgian JJ B-NP B-MISC\nPSV NNP I-NP I-ORG\n")
    with pytest.raises(ValueError, match=r"line 2: I-ORG starts an entity \(after B-MISC\)"):
        parse_conll(after_other_type, scheme="iob2")
    # configured IOB1 reads the IOB2 copy as well: B- starts an entity in either reading
    assert parse_conll(IOB2_FILE, scheme="iob1").labels == parse_conll(IOB1_FILE).labels
    assert parse_conll(IOB2_FILE, scheme="iob2").scheme == "iob2"
    assert parse_conll(IOB1_FILE, scheme="iob1").scheme == "iob1"
    with pytest.raises(ValueError, match="scheme must be one of auto, iob1, iob2, got 'bio'"):
        parse_conll(IOB1_FILE, scheme="bio")


def test_detection_edge_cases(tmp_path):
    # no entity at all: the encodings read alike; called IOB2
    plain = write(tmp_path / "plain.txt", "nothing NN B-NP O\nhere RB B-ADVP O\n")
    assert parse_conll(plain).scheme == "iob2"
    # both kinds in one file (B- after O and an I- starting an entity): IOB1, every entity found
    mixed = write(tmp_path / "mixed.txt", "Bonn NNP B-NP B-LOC\nand CC O O\nParis NNP B-NP I-LOC\n")
    parsed = parse_conll(mixed)
    assert parsed.scheme == "iob1" and parsed.labels == [["B-LOC", "O", "B-LOC"]]


def test_to_iob2():
    assert to_iob2(["I-PER", "I-PER", "O", "I-LOC"]) == ["B-PER", "I-PER", "O", "B-LOC"]
    assert to_iob2(["I-ORG", "B-ORG", "I-ORG"]) == ["B-ORG", "B-ORG", "I-ORG"]      # adjacent same type
    assert to_iob2(["I-MISC", "I-ORG", "I-ORG"]) == ["B-MISC", "B-ORG", "I-ORG"]    # type change starts an entity
    assert to_iob2(["B-PER", "I-PER", "O", "B-LOC"]) == ["B-PER", "I-PER", "O", "B-LOC"]   # IOB2 unchanged
    assert to_iob2([]) == []


# -- documents and layout ----------------------------------------------------------------------------------------


def test_documents_and_sentence_boundaries(tmp_path):
    text = ("Before NNP B-NP B-PER\n\n"                                  # a sentence before any -DOCSTART-: document 0
            "-DOCSTART- -X- -X- O\n\n"
            "One CD B-NP O\n\n\n\n"                                       # several blank lines: one boundary
            "Two CD B-NP O\n"
            "-DOCSTART- -X- O O\n"                                        # a -DOCSTART- right after a sentence ends it
            "Three CD B-NP O\n"
            "-DOCSTART- -X- -X- O\n\n"
            "-DOCSTART- -X- -X- O\n\n"                                    # an empty document
            "Four CD B-NP O")                                            # no newline at the end
    parsed = parse_conll(write(tmp_path / "docs.txt", text))
    assert parsed.words == [["Before"], ["One"], ["Two"], ["Three"], ["Four"]]
    assert parsed.doc_index == [0, 1, 1, 2, 4] and parsed.documents == 5
    # no -DOCSTART- at all: one document
    assert parse_conll(write(tmp_path / "nodoc.txt", "a DT B-NP O\n\nb DT B-NP O\n")).doc_index == [0, 0]


def test_line_ends_tabs_and_other_spaces(tmp_path):
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(b"\xef\xbb\xbf-DOCSTART- -X- -X- O\r\n\r\nBonn NNP I-NP I-LOC\r\nsays\tVBZ\tI-VP\tO\r\n\r\n")
    parsed = parse_conll(crlf)
    assert parsed.words == [["Bonn", "says"]] and parsed.labels == [["B-LOC", "O"]]
    # a no-break space inside a token is part of it (only spaces and tabs separate columns)
    nbsp = parse_conll(write(tmp_path / "nbsp.txt", "10\u00a0000 CD B-NP O\n"))
    assert nbsp.words == [["10\u00a0000"]]


# -- malformed files ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("line, message", [
    ("Bonn NNP I-LOC", r"line 4: 3 columns, expected 4 \(token POS chunk NER, separated by spaces\): 'Bonn NNP I-LOC'"),
    ("Bonn NNP I-NP I-LOC extra", r"line 4: 5 columns, expected 4"),
    ("Bonn NNP I-NP B-CITY", r"line 4: unknown NER tag 'B-CITY' \(expected O, B-TYPE or I-TYPE with TYPE one of "
                             r"PER ORG LOC MISC\)"),
    ("Bonn NNP I-NP i-loc", r"line 4: unknown NER tag 'i-loc'"),
    ("Bonn NNP I-NP E-LOC", r"line 4: unknown NER tag 'E-LOC'"),
    ("Bonn NNP I-NP LOC", r"line 4: unknown NER tag 'LOC'"),
    ("Bonn NNP I-NP I-", r"line 4: unknown NER tag 'I-'"),
])
def test_malformed_lines_name_file_and_line(tmp_path, line, message):
    path = write(tmp_path / "bad.txt", f"-DOCSTART- -X- -X- O\n\nIn IN I-PP O\n{line}\n. . O O\n")
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path}/bad.txt, ") + message):
        parse_conll(path)


def test_other_entity_types_when_allowed(tmp_path):
    path = write(tmp_path / "wnut.txt", "Bonn NNP I-NP B-CITY\n")
    assert parse_conll(path, entity_types=None).labels == [["B-CITY"]]


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such CoNLL file"):
        parse_conll(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match=r"empty\.txt: no sentences"):
        parse_conll(write(tmp_path / "empty.txt", "-DOCSTART- -X- -X- O\n\n"))
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"In IN I-PP O\n\nM\xfcnchen NNP I-NP I-LOC\n")
    with pytest.raises(ValueError, match=r"latin1\.txt, line 3: not UTF-8"):
        parse_conll(latin1)


# -- as a dataset, through the task --------------------------------------------------------------------------------


def test_read_conll_dataset(cache, tmp_path):
    data = read_conll(IOB1_FILE, cache_dir=cache)
    assert data.column_names == ["idx", "doc_index", "words", "labels"]
    assert data["idx"] == list(range(8)) and data["doc_index"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert data["labels"] == [tags.split(" ") for _, _, tags in EXPECTED]
    assert data.info.description == "CoNLL-2003 eng.train: IOB1"
    assert read_conll(IOB2_FILE, cache_dir=cache).info.description == "CoNLL-2003 train.txt: IOB2"
    # cached under a fingerprint of the file's bytes: the same file again, the same dataset; another file, another
    again = read_conll(IOB1_FILE, cache_dir=cache)
    assert again._fingerprint == data._fingerprint and again.cache_files == data.cache_files
    changed = write(tmp_path / "eng.train", IOB1_FILE.read_text().replace("Kenya NNP", "Uganda NNP"))
    other = read_conll(changed, cache_dir=cache)
    assert other._fingerprint != data._fingerprint and "Uganda" in other[2]["words"]


def test_task_description():
    task = get_task("conll2003")
    assert task is CONLL2003 and get_task("CoNLL-2003") is task
    assert "conll2003" not in TASKS      # TASKS stays GLUE's nine and SWAG
    assert task.kind == "token" and task.main_metric == "f1"
    assert task.label_names == ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
    assert task.num_labels == 9 and task.id2label[2] == "I-PER"
    assert task.splits == {"train": "eng.train", "dev": "eng.testa", "test": "eng.testb"}
    assert task.eval_splits == ("dev", "test") and task.test_splits == ()   # the test set is labelled: scored


@pytest.mark.parametrize("names", [("eng.train", "eng.testa", "eng.testb"), ("train.txt", "valid.txt", "test.txt")])
def test_task_reads_a_directory_in_either_layout(tmp_path, cache, names):
    source = IOB1_FILE if names[0] == "eng.train" else IOB2_FILE
    for name in names:
        shutil.copy(source, tmp_path / name)
    task = get_task("conll2003")
    for split, name in zip(("train", "dev", "test"), names):
        assert task.split_file(split, tmp_path) == (tmp_path / name).resolve()
        data = task.read(split, tmp_path, cache_dir=cache)
        assert data["labels"] == [tags.split(" ") for _, _, tags in EXPECTED]
    assert task.read("dev", tmp_path / names[1], cache_dir=cache).num_rows == 8   # the file itself


def test_task_read_errors(tmp_path, cache):
    task = get_task("conll2003")
    with pytest.raises(FileNotFoundError, match=r"conll2003 dev: no eng\.testa or valid\.txt in .*train: eng\.train "
                                                r"or train\.txt; dev: eng\.testa or valid\.txt"):
        task.read("dev", tmp_path, cache_dir=cache)
    with pytest.raises(FileNotFoundError, match=r"conll2003 train: .*nowhere does not exist"):
        task.read("train", tmp_path / "nowhere", cache_dir=cache)
    with pytest.raises(ValueError, match="no split 'validation'; its splits: train, dev, test"):
        task.read("validation", tmp_path, cache_dir=cache)
    shutil.copy(IOB1_FILE, tmp_path / "eng.train")
    with pytest.raises(ValueError, match=r"eng\.train, line 3: I-PER starts an entity"):
        task.read("train", tmp_path, cache_dir=cache, scheme="iob2")
