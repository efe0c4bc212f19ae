"""GLUE leaderboard files: names, header, label text for every task, end to end from a test file."""
from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import pytest  # noqa: E402

from pipeline.finetuning.tasks import SUBMISSION_FILES, TASKS, get_task, write_submission  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "glue"

# (task, split) -> (file, predictions, the prediction column the leaderboard expects)
EXPECTED = {
    ("cola", "test"): ("CoLA.tsv", [1, 0], ["1", "0"]),
    ("sst2", "test"): ("SST-2.tsv", [0, 1], ["0", "1"]),
    ("mrpc", "test"): ("MRPC.tsv", [1, 0], ["1", "0"]),
    ("stsb", "test"): ("STS-B.tsv", [3.14159, 0.0], ["3.142", "0.000"]),
    ("qqp", "test"): ("QQP.tsv", [0, 1], ["0", "1"]),
    ("mnli", "test_matched"): ("MNLI-m.tsv", [0, 1, 2], ["entailment", "neutral", "contradiction"]),
    ("mnli", "test_mismatched"): ("MNLI-mm.tsv", [2, 0], ["contradiction", "entailment"]),
    ("mnli", "ax"): ("AX.tsv", [1, 2, 0], ["neutral", "contradiction", "entailment"]),
    ("qnli", "test"): ("QNLI.tsv", [0, 1], ["entailment", "not_entailment"]),
    ("rte", "test"): ("RTE.tsv", [1, 0], ["not_entailment", "entailment"]),
    ("wnli", "test"): ("WNLI.tsv", [1, 0], ["1", "0"]),
}


def test_every_glue_test_set_has_its_leaderboard_file():
    names = {(task.name, split): task.submission_file(split) for task in TASKS.values() for split in task.test_splits}
    assert {key: name for key, name in names.items() if name} == {key: v[0] for key, v in EXPECTED.items()}
    assert sorted(SUBMISSION_FILES) == sorted(v[0] for v in EXPECTED.values())
    assert get_task("swag").submission_file("test") is None        # not a GLUE task
    assert get_task("mnli").submission_file("dev_matched") is None


@pytest.mark.parametrize("task_name,split", sorted(EXPECTED))
def test_submission_file_content(tmp_path, task_name, split):
    name, predictions, shown = EXPECTED[(task_name, split)]
    idx = list(range(100, 100 + len(predictions)))
    path = write_submission(task_name, split, idx, predictions, tmp_path / "glue_submission")
    assert path == tmp_path / "glue_submission" / name
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[0] == "index\tprediction" and lines[-1] == ""
    assert lines[1:-1] == [f"{i}\t{text}" for i, text in zip(idx, shown)]


def test_prediction_names():
    assert get_task("mnli").prediction_name(2) == "contradiction"
    assert get_task("qnli").prediction_name(1) == "not_entailment"
    assert get_task("cola").prediction_name(1) == "1"
    assert get_task("stsb").prediction_name(4.9996) == "5.000"
    with pytest.raises(ValueError, match=r"prediction 3 is not a label id in 0..2"):
        get_task("mnli").prediction_name(3)
    with pytest.raises(ValueError, match="not a finite score"):
        get_task("stsb").prediction_name(float("nan"))


def test_end_to_end_from_the_test_file(tmp_path):
    """Read MNLI test_matched, predict, write MNLI-m.tsv: the file's own indices come back."""
    mnli = get_task("mnli")
    test = mnli.read("test_matched", FIXTURES / "MNLI", cache_dir=tmp_path / "cache")
    path = write_submission(mnli, "test_matched", test["idx"], [2, 2, 0], tmp_path)
    assert path.read_text(encoding="utf-8") == ("index\tprediction\n0\tcontradiction\n1\tcontradiction\n"
                                                "2\tentailment\n")


def test_bad_submissions(tmp_path):
    with pytest.raises(ValueError, match=r"rte dev: the GLUE leaderboard takes no file .*\(splits with one: test\)"):
        write_submission("rte", "dev", [0], [1], tmp_path)
    with pytest.raises(ValueError, match=r"swag test: .*splits with one: none"):
        write_submission("swag", "test", [0], [1], tmp_path)
    with pytest.raises(ValueError, match="2 indices for 1 predictions"):
        write_submission("sst2", "test", [0, 1], [1], tmp_path)
    with pytest.raises(ValueError, match="no predictions"):
        write_submission("sst2", "test", [], [], tmp_path)
    with pytest.raises(ValueError, match="not a label id"):
        write_submission("sst2", "test", [0], [2], tmp_path)
    with pytest.raises(ValueError, match="no split 'test'"):
        write_submission("mnli", "test", [0], [1], tmp_path)
    assert not list(tmp_path.iterdir())   # nothing half-written
