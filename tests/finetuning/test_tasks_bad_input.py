"""pipeline.finetuning.tasks readers on bad input of every kind: each stops the read naming the file, the line and
the row, or says which file a task wants."""
from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

# Never the network; no progress bars in the test log.  Set before `datasets` is imported.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import pytest  # noqa: E402

from pipeline.finetuning.tasks import get_task  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "glue"


# -- bad input ---------------------------------------------------------------------------------------------------


def copy_fixture(tmp_path: Path, task_dir: str, name: str) -> Path:
    target = tmp_path / task_dir
    target.mkdir(exist_ok=True)
    return Path(shutil.copy(FIXTURES / task_dir / name, target / name))


def replace_line(path: Path, number: int, make) -> str:
    """Rewrite line ``number`` (1-based) with ``make(old_line)``; return the new line."""
    lines = path.read_text(encoding="utf-8").split("\n")
    lines[number - 1] = make(lines[number - 1])
    path.write_text("\n".join(lines), encoding="utf-8")
    return lines[number - 1]


def test_missing_column_names_file_line_and_row(tmp_path, cache):
    path = copy_fixture(tmp_path, "MNLI", "dev_matched.tsv")
    row = replace_line(path, 3, lambda line: "\t".join(line.split("\t")[:12]))   # label2.. gold_label lost
    with pytest.raises(ValueError) as error:
        get_task("mnli").read("dev_matched", path, cache_dir=cache)
    message = str(error.value)
    assert str(path) in message and "line 3" in message
    assert "column 'gold_label' is missing (the row has 12 of the file's 16 fields)" in message
    assert repr(row)[:60] in message


def test_missing_text_in_a_headerless_file(tmp_path, cache):
    path = tmp_path / "in_domain_dev.tsv"
    path.write_text("gj04\t1\t\tThe sailors rode the breeze clear of the rocks.\ngj04\t0\t*\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"in_domain_dev.tsv, line 2: column 'sentence' is missing .*'gj04\\t0\\t\*'"):
        get_task("cola").read("dev", tmp_path, cache_dir=cache)


def test_empty_text_is_kept_but_a_missing_one_is_not(tmp_path, cache):
    path = tmp_path / "dev.tsv"
    path.write_text("index\tsentence1\tsentence2\tlabel\n0\tA dog barks.\t\tentailment\n", encoding="utf-8")
    assert get_task("rte").read("dev", path, cache_dir=cache)["text_b"] == [""]
    path.write_text("index\tsentence1\tsentence2\tlabel\n0\tA dog barks.\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: column 'sentence2' is missing"):
        get_task("rte").read("dev", path, cache_dir=cache)


def test_label_outside_the_label_set(tmp_path, cache):
    path = copy_fixture(tmp_path, "RTE", "dev.tsv")
    replace_line(path, 4, lambda line: line.replace("not_entailment", "neutral"))
    with pytest.raises(ValueError, match=r"dev.tsv, line 4: label 'neutral' in column 'label' is not one of rte's "
                                         r"labels \('entailment', 'not_entailment'\): '2\\tScientists found"):
        get_task("rte").read("dev", path, cache_dir=cache)
    path = copy_fixture(tmp_path, "QQP", "train.tsv")
    replace_line(path, 2, lambda line: line[:-1] + "2")
    with pytest.raises(ValueError, match=r"train.tsv, line 2: label '2' in column 'is_duplicate'"):
        get_task("qqp").read("train", path, cache_dir=cache)


def test_stsb_score_outside_0_to_5(tmp_path, cache):
    path = tmp_path / "sts-dev.csv"
    path.write_text("main-captions\tMSRvid\t2012test\t0000\t5.000\tA man dances.\tA man is dancing.\n"
                    "main-captions\tMSRvid\t2012test\t0002\t5.5\tA child rides.\tA kid rides.\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2: score '5.5' in column 'score' is not a number in \[0, 5\]"):
        get_task("stsb").read("dev", tmp_path, cache_dir=cache)


def test_more_fields_than_columns(tmp_path, cache):
    for line in (2, 4):   # pandas would drop the extra field of the first row silently, fail on later ones
        path = copy_fixture(tmp_path, "WNLI", "train.tsv")
        replace_line(path, line, lambda text: text + "\textra")
        with pytest.raises(ValueError, match=rf"train.tsv, line {line}: 5 fields, more than the 4 columns"):
            get_task("wnli").read("train", path, cache_dir=cache)


def test_bad_index(tmp_path, cache):
    path = copy_fixture(tmp_path, "RTE", "train.tsv")
    replace_line(path, 3, lambda line: "x" + line)
    with pytest.raises(ValueError, match=r"line 3: index 'x1' in column 'index' is not an integer"):
        get_task("rte").read("train", path, cache_dir=cache)


def test_swag_missing_ending_line_number_counts_quoted_commas(tmp_path, cache, downstream):
    source = downstream / "swag" / "hf_datasets_dummy_val.csv"
    path = tmp_path / "val.csv"
    lines = source.read_text(encoding="utf-8").split("\n")
    fields = next(csv.reader([lines[2]]))
    lines[2] = ",".join(f'"{field}"' for field in fields[:9])       # ending2, ending3 and label gone
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(ValueError, match=r"val.csv, line 3: column 'ending2' is missing \(the row has 9 of"):
        get_task("swag").read("dev", tmp_path, cache_dir=cache)


def test_unlabelled_file_for_a_labelled_split(cache):
    with pytest.raises(ValueError, match=r"no 'gold_label' column .*the train split needs labels"):
        get_task("mnli").read("train", FIXTURES / "MNLI" / "test_matched.tsv", cache_dir=cache)


def test_not_a_file_of_the_task(cache):
    with pytest.raises(ValueError, match=r"line 1: expected a header naming the columns question1, question2"):
        get_task("qqp").read("train", FIXTURES / "RTE" / "train.tsv", cache_dir=cache)


def test_empty_split(tmp_path, cache):
    path = tmp_path / "dev.tsv"
    path.write_text("index\tsentence1\tsentence2\tlabel\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{path}: a header and no rows \(an empty rte split\)"):
        get_task("rte").read("dev", path, cache_dir=cache)
    path.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{path}: the file is empty"):
        get_task("rte").read("dev", path, cache_dir=cache)
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="the file is empty"):
        get_task("cola").read("dev", path, cache_dir=cache)


def test_missing_file(tmp_path, cache):
    with pytest.raises(FileNotFoundError) as error:
        get_task("mnli").read("dev_mismatched", tmp_path, cache_dir=cache)
    message = str(error.value)
    assert f"no dev_mismatched.tsv in {tmp_path}" in message
    assert "train: train.tsv; dev_matched: dev_matched.tsv; dev_mismatched: dev_mismatched.tsv" in message
    assert "ax: diagnostic.tsv or ../diagnostic/diagnostic.tsv" in message
    with pytest.raises(FileNotFoundError, match=r"no train.tsv in .*train: train.tsv or in_domain_train.tsv"):
        get_task("cola").read("train", tmp_path, cache_dir=cache)
    with pytest.raises(FileNotFoundError, match=r"does not exist.*dev: dev.tsv or sts-dev.csv"):
        get_task("stsb").read("dev", tmp_path / "nowhere" / "sts-dev.csv", cache_dir=cache)


def test_not_utf8(tmp_path, cache):
    path = tmp_path / "train.tsv"
    path.write_bytes(b"sentence\tlabel\nfine\t1\nun caf\xe9 agr\xe9able\t1\n")
    with pytest.raises(ValueError, match=r"train.tsv, line 3: not UTF-8 text"):
        get_task("sst2").read("train", path, cache_dir=cache)
