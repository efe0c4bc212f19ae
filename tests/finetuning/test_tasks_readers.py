"""pipeline.finetuning.tasks readers: the real GLUE/SWAG data in ../shared/data/downstream, hand-written files in GLUE's
exact formats (tests/finetuning/fixtures/glue/), hub-layout parquet directories written here, and every kind of bad
input."""
from __future__ import annotations

import csv
import math
import os
import shutil
from pathlib import Path

# Never the network; no progress bars in the test log.  Set before `datasets` is imported.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import pytest  # noqa: E402

from pipeline.finetuning.tasks import TASKS, get_task  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "glue"


def data_lines(path: Path) -> int:
    """Non-empty lines of a file, counted without pandas or csv."""
    with open(path, encoding="utf-8") as stream:
        return sum(1 for line in stream if line.strip("\r\n"))


# -- registry ----------------------------------------------------------------------------------------------------


def test_registry_has_the_ten_tasks():
    assert list(TASKS) == ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "swag"]
    assert get_task("SST-2") is TASKS["sst2"] and get_task("sts-b") is TASKS["stsb"]
    known = "cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli, swag"
    with pytest.raises(ValueError, match=f"unknown task 'squad'; known tasks: {known}"):
        get_task("squad")


def test_task_descriptions():
    mnli = get_task("mnli")
    assert mnli.kind == "classification" and mnli.label_names == ("entailment", "neutral", "contradiction")
    assert mnli.eval_splits == ("dev_matched", "dev_mismatched")
    assert mnli.test_splits == ("test_matched", "test_mismatched", "ax")
    assert mnli.splits["ax"] == "diagnostic.tsv" and mnli.splits["dev_matched"] == "dev_matched.tsv"
    assert mnli.num_labels == 3 and mnli.id2label == {0: "entailment", 1: "neutral", 2: "contradiction"}
    stsb = get_task("stsb")
    assert stsb.kind == "regression" and stsb.label_names is None and stsb.num_labels == 1 and stsb.id2label is None
    assert get_task("swag").kind == "multiple_choice" and get_task("swag").num_labels == 4
    # label ids in the hub's ClassLabel order (nyu-mll/glue)
    assert get_task("wnli").label_names == ("not_entailment", "entailment")
    assert get_task("qnli").label_names == ("entailment", "not_entailment")
    for task in TASKS.values():
        assert task.eval_splits and task.test_splits
        assert task.main_metric in {"acc", "mcc", "acc_and_f1", "pearson_spearman_mean"}


def test_unknown_split():
    with pytest.raises(ValueError, match="no split 'validation'.*train, dev, test"):
        get_task("sst2").read("validation", FIXTURES / "RTE")


# -- real data ---------------------------------------------------------------------------------------------------


def test_sst2_real(downstream, cache):
    sst2 = get_task("sst2")
    train = sst2.read("train", downstream / "glue" / "SST-2", cache_dir=cache)
    dev = sst2.read("dev", downstream / "glue" / "SST-2" / "dev.tsv", cache_dir=cache)
    assert (len(train), len(dev)) == (67_349, 872)
    assert train.column_names == ["idx", "text_a", "text_b", "label"]
    assert str(train.features["idx"].dtype) == "int64" and str(train.features["label"].dtype) == "int64"
    assert train["idx"][:3] == [0, 1, 2] and train["idx"][-1] == 67_348   # no index column: the row number
    assert set(train["label"]) == {0, 1} and set(dev["label"]) == {0, 1}
    assert set(train["text_b"]) == {None}
    assert all(isinstance(text, str) for text in train["text_a"])
    with open(downstream / "glue" / "SST-2" / "dev.tsv", encoding="utf-8") as stream:
        rows = [line.rstrip("\n").split("\t") for line in stream][1:]
    assert dev["text_a"] == [row[0] for row in rows] and dev["label"] == [int(row[1]) for row in rows]


def test_sst2_second_read_uses_the_cache(downstream, cache):
    sst2 = get_task("sst2")
    first = sst2.read("dev", downstream / "glue" / "SST-2", cache_dir=cache)
    again = sst2.read("dev", downstream / "glue" / "SST-2", cache_dir=cache)
    assert first.cache_files == again.cache_files and str(cache) in first.cache_files[0]["filename"]


def test_cola_raw_release(downstream, cache):
    cola = get_task("cola")
    directory = downstream / "glue" / "CoLA"            # in_domain_train.tsv / in_domain_dev.tsv, no header
    train = cola.read("train", directory, cache_dir=cache)
    dev = cola.read("dev", directory, cache_dir=cache)
    assert (len(train), len(dev)) == (8_551, 527)
    first = dev[0]
    assert first == {"idx": 0, "text_a": "The sailors rode the breeze clear of the rocks.", "text_b": None, "label": 1}
    assert set(train["label"]) == {0, 1}
    with open(directory / "in_domain_dev.tsv", encoding="utf-8") as stream:
        gold = [int(line.split("\t")[1]) for line in stream]
    assert dev["label"] == gold
    out_of_domain = cola.read("dev", directory / "out_of_domain_dev.tsv", cache_dir=cache)
    assert len(out_of_domain) == data_lines(directory / "out_of_domain_dev.tsv")


def test_stsb_original_csv(downstream, cache):
    stsb = get_task("stsb")
    directory = downstream / "glue" / "STS-B"           # sts-train.csv etc.: tab separated, no header
    for split, name in (("train", "sts-train.csv"), ("dev", "sts-dev.csv"), ("test", "sts-test.csv")):
        data = stsb.read(split, directory, cache_dir=cache)
        assert len(data) == data_lines(directory / name), split
        assert str(data.features["label"].dtype) == "float32"
        assert all(0.0 <= score <= 5.0 for score in data["label"])
    train = stsb.read("train", directory, cache_dir=cache)
    with open(directory / "sts-train.csv", encoding="utf-8") as stream:
        rows = [line.rstrip("\n").split("\t") for line in stream]
    nine = [i for i, row in enumerate(rows) if len(row) == 9]
    assert len(nine) == 197 and all(len(row) in (7, 9) for row in rows)
    for i in nine[:5] + nine[-5:]:   # the extra source columns are not text
        assert train[i]["text_a"] == rows[i][5] and train[i]["text_b"] == rows[i][6]
        assert train[i]["label"] == pytest.approx(float(rows[i][4]))
    assert train[0] == {"idx": 0, "text_a": "A plane is taking off.", "text_b": "An air plane is taking off.",
                        "label": 5.0}


def test_qnli_dev(downstream, cache):
    qnli = get_task("qnli").read("dev", downstream / "glue" / "QNLI", cache_dir=cache)
    assert len(qnli) == 5_463
    assert qnli[0]["idx"] == 0 and qnli[0]["label"] == 0   # entailment
    assert qnli[0]["text_a"] == "What came into force after the new constitution was herald?"
    assert qnli[1]["label"] == 1                           # not_entailment
    assert qnli["idx"] == list(range(5_463))


def test_swag_samples(downstream, cache):
    swag = get_task("swag")
    for name, split in (("allennlp_fixture_swag_val_sample.csv", "dev"), ("hf_datasets_dummy_train.csv", "train"),
                        ("hf_datasets_dummy_val.csv", "dev"), ("hf_datasets_dummy_test.csv", "test")):
        path = downstream / "swag" / name
        with open(path, encoding="utf-8", newline="") as stream:
            rows = list(csv.DictReader(stream))
        data = swag.read(split, path, cache_dir=cache)
        assert data.column_names == ["idx", "context", "start", "endings", "label"]
        assert len(data) == len(rows), name
        assert data["context"] == [row["sent1"] for row in rows]
        assert data["start"] == [row["sent2"] for row in rows]
        assert data["endings"] == [[row[f"ending{k}"] for k in range(4)] for row in rows]
        assert data["idx"] == [int(row[""]) for row in rows]
        assert data["label"] == ([int(row["label"]) for row in rows] if split != "test" else [-1] * len(rows))


# -- GLUE formats (hand-written fixtures) ------------------------------------------------------------------------


def test_mnli_all_splits(cache):
    mnli = get_task("mnli")
    train = mnli.read("train", FIXTURES / "MNLI", cache_dir=cache)             # 12 columns
    assert train["label"] == [2, 1, 0, 2] and train["idx"] == [0, 1, 2, 3]
    assert train[3]["text_a"] == '"We\'ll leave at dawn, and we won\'t stop until we reach the river.'  # lone quote
    matched = mnli.read("dev_matched", FIXTURES / "MNLI", cache_dir=cache)     # 16 columns
    # the last row's label1 is "neutral", its gold_label "entailment": the gold label counts
    assert matched["label"] == [2, 2, 0]
    assert matched[2]["text_a"] == "uh-huh well we always go camping in the fall"
    assert matched[2]["text_b"] == "They camp every autumn."
    mismatched = mnli.read("dev_mismatched", FIXTURES / "MNLI", cache_dir=cache)
    assert mismatched["label"] == [2, 0, 1]
    test = mnli.read("test_matched", FIXTURES / "MNLI", cache_dir=cache)       # 10 columns, no label
    assert test["label"] == [-1, -1, -1] and test["idx"] == [0, 1, 2]
    assert len(mnli.read("test_mismatched", FIXTURES / "MNLI", cache_dir=cache)) == 2
    ax = mnli.read("ax", FIXTURES / "MNLI", cache_dir=cache)                   # diagnostic.tsv
    assert ax["text_b"][0] == "The cat did not sit on the mat." and ax["label"] == [-1, -1, -1]


def test_mnli_diagnostic_beside_the_mnli_directory(tmp_path, cache):
    """GLUE's download keeps it in glue_data/diagnostic/diagnostic.tsv, next to glue_data/MNLI/."""
    (tmp_path / "MNLI").mkdir()
    (tmp_path / "diagnostic").mkdir()
    shutil.copy(FIXTURES / "MNLI" / "diagnostic.tsv", tmp_path / "diagnostic" / "diagnostic.tsv")
    assert len(get_task("mnli").read("ax", tmp_path / "MNLI", cache_dir=cache)) == 3


def test_qqp_keeps_null_like_text(cache):
    qqp = get_task("qqp")
    train = qqp.read("train", FIXTURES / "QQP", cache_dir=cache)
    assert train["idx"] == [201359, 37215, 364020, 288144]                      # the id column
    assert train["label"] == [1, 0, 1, 0]
    assert train[2]["text_a"] == 'What does "NA" mean on a job application form?'
    assert train[3]["text_b"] == '"Is Java harder to learn than Python?'
    dev = qqp.read("dev", FIXTURES / "QQP", cache_dir=cache)
    assert dev[2]["text_b"] == "null"
    test = qqp.read("test", FIXTURES / "QQP", cache_dir=cache)
    assert test["text_b"][1] == "NaN" and test["label"] == [-1, -1, -1] and test["idx"] == [0, 1, 2]


def test_mrpc_with_byte_order_mark(cache):
    mrpc = get_task("mrpc")
    assert (FIXTURES / "MRPC" / "train.tsv").read_bytes().startswith(b"\xef\xbb\xbfQuality")
    train = mrpc.read("train", FIXTURES / "MRPC", cache_dir=cache)
    assert train["label"] == [1, 0, 1] and train["idx"] == [0, 1, 2]          # no index column: row number
    assert train[0]["text_a"] == "The airline said it would cut 2,500 jobs by the end of the year."
    assert mrpc.read("dev", FIXTURES / "MRPC", cache_dir=cache)["label"] == [1, 0, 1]
    test = mrpc.read("test", FIXTURES / "MRPC", cache_dir=cache)
    assert test["idx"] == [0, 1] and test["label"] == [-1, -1]


def test_rte_and_wnli(cache):
    rte = get_task("rte")
    assert rte.read("train", FIXTURES / "RTE", cache_dir=cache)["label"] == [0, 1, 0]
    assert rte.read("dev", FIXTURES / "RTE", cache_dir=cache)["label"] == [1, 0, 1]
    assert rte.read("test", FIXTURES / "RTE", cache_dir=cache)["label"] == [-1, -1]
    wnli = get_task("wnli")   # 1 = entailment, as in GLUE's file
    assert wnli.read("train", FIXTURES / "WNLI", cache_dir=cache)["label"] == [1, 0, 1]
    assert wnli.read("dev", FIXTURES / "WNLI", cache_dir=cache)["label"] == [1, 0]
    test = wnli.read("test", FIXTURES / "WNLI", cache_dir=cache)
    assert test["text_b"][0] == "Sara was going out in the rain." and test["label"] == [-1, -1]


def test_glue_stsb_tsv_and_cola_test(tmp_path, cache):
    """GLUE's own STS-B TSV (a header, 10 columns) and CoLA test.tsv (index, sentence) next to the raw formats."""
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    (tmp_path / "dev.tsv").write_text(
        header + "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man is playing a flute.\t"
        "A man plays a flute.\t4.800\n"
        "1\tmain-news\theadlines\t2015\t0031\tnone\tnone\tStocks fell on Monday.\tNULL\t0.600\n", encoding="utf-8")
    (tmp_path / "test.tsv").write_text(header.replace("\tscore", "") + "0\tmain-forums\tdeft-forum\t2014\t0001\t"
                                       "none\tnone\tI agree with you.\tI don't agree.\n", encoding="utf-8")
    stsb = get_task("stsb")
    dev = stsb.read("dev", tmp_path, cache_dir=cache)
    assert dev["label"] == pytest.approx([4.8, 0.6]) and dev["text_b"] == ["A man plays a flute.", "NULL"]
    test = stsb.read("test", tmp_path, cache_dir=cache)
    assert math.isnan(test[0]["label"]) and test[0]["text_a"] == "I agree with you."
    cola_test = tmp_path / "cola_test.tsv"
    cola_test.write_text("index\tsentence\n0\tBill whistled past the house.\n1\tThe more you read, the less "
                         "you understand.\n", encoding="utf-8")
    data = get_task("cola").read("test", cola_test, cache_dir=cache)
    assert data["idx"] == [0, 1] and data["label"] == [-1, -1] and data["text_a"][0] == "Bill whistled past the house."


def test_blank_lines_are_skipped_and_line_numbers_stay_true(tmp_path, cache):
    path = tmp_path / "dev.tsv"
    path.write_text("sentence\tlabel\n\nfine\t1\n\n\nbroken\t7\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 6: label '7'"):
        get_task("sst2").read("dev", path, cache_dir=cache)
    path.write_text("sentence\tlabel\n\nfine\t1\n\n", encoding="utf-8")
    assert get_task("sst2").read("dev", path, cache_dir=cache)["text_a"] == ["fine"]


# -- hub layout --------------------------------------------------------------------------------------------------


def write_parquet(path: Path, columns: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


HUB_README = """---
configs:
{configs}
---
# GLUE (a local copy in hub layout)
"""


def hub_readme(config_splits: dict[str, list[str]]) -> str:
    lines = []
    for config, splits in config_splits.items():
        lines += [f"- config_name: {config}", "  data_files:"]
        for split in splits:
            lines += [f"  - split: {split}", f"    path: {config}/{split}-*"]
    return HUB_README.format(configs="\n".join(lines))


@pytest.fixture(scope="module")
def hub_glue(tmp_path_factory) -> Path:
    """What a snapshot of nyu-mll/glue holds, for sst2, mnli, ax and stsb: parquet per config and split + README."""
    root = tmp_path_factory.mktemp("glue_hub")
    shard = "-00000-of-00001.parquet"
    write_parquet(root / "sst2" / f"train{shard}", {"sentence": ["a gripping , funny film ", "tedious "],
                                                    "label": [1, 0], "idx": [0, 1]})
    write_parquet(root / "sst2" / f"validation{shard}", {"sentence": ["it 's a charming journey . "],
                                                         "label": [1], "idx": [0]})
    write_parquet(root / "sst2" / f"test{shard}", {"sentence": ["uneasy mishmash of styles "], "label": [-1],
                                                   "idx": [0]})
    pair = {"premise": ["The council approved the budget.", "We went out after dinner."],
            "hypothesis": ["The budget was rejected.", "We stayed in."], "idx": [0, 1]}
    write_parquet(root / "mnli" / f"train{shard}", {**pair, "label": [2, 2]})
    write_parquet(root / "mnli" / f"validation_matched{shard}", {**pair, "label": [2, 0]})
    write_parquet(root / "mnli" / f"test_matched{shard}", {**pair, "label": [-1, -1]})
    write_parquet(root / "ax" / f"test{shard}", {**pair, "label": [-1, -1]})
    write_parquet(root / "stsb" / f"validation{shard}", {"sentence1": ["A man is playing a flute."],
                                                         "sentence2": ["A man plays a flute."], "label": [3.8],
                                                         "idx": [0]})
    write_parquet(root / "stsb" / f"test{shard}", {"sentence1": ["A cat sleeps."], "sentence2": ["A dog runs."],
                                                   "label": [-1.0], "idx": [0]})
    (root / "README.md").write_text(hub_readme({"sst2": ["train", "validation", "test"],
                                                "mnli": ["train", "validation_matched", "test_matched"],
                                                "ax": ["test"], "stsb": ["validation", "test"]}), encoding="utf-8")
    return root


def test_hub_layout_with_readme(hub_glue, cache):
    sst2 = get_task("sst2")
    assert sst2.read("train", hub_glue, cache_dir=cache).to_list() == [
        {"idx": 0, "text_a": "a gripping , funny film ", "text_b": None, "label": 1},
        {"idx": 1, "text_a": "tedious ", "text_b": None, "label": 0}]
    assert sst2.read("dev", hub_glue, cache_dir=cache)["label"] == [1]
    assert sst2.read("test", hub_glue, cache_dir=cache)["label"] == [-1]
    mnli = get_task("mnli")
    dev = mnli.read("dev_matched", hub_glue, cache_dir=cache)
    assert dev["text_a"] == ["The council approved the budget.", "We went out after dinner."]
    assert dev["text_b"] == ["The budget was rejected.", "We stayed in."] and dev["label"] == [2, 0]
    assert mnli.read("ax", hub_glue, cache_dir=cache)["label"] == [-1, -1]        # config ax, split test
    stsb = get_task("stsb")
    assert stsb.read("dev", hub_glue, cache_dir=cache)["label"] == pytest.approx([3.8])
    assert math.isnan(stsb.read("test", hub_glue, cache_dir=cache)["label"][0])
    assert str(stsb.read("dev", hub_glue, cache_dir=cache).features["label"].dtype) == "float32"


def test_hub_layout_without_readme(tmp_path, cache):
    """Parquet files under <config>/ only (no README listing configs), or one config's files directly."""
    write_parquet(tmp_path / "qnli" / "validation-00000-of-00001.parquet",
                  {"question": ["Where is the Eiffel Tower?"], "sentence": ["The Eiffel Tower is in Paris."],
                   "label": [0], "idx": [7]})
    expected = [{"idx": 7, "text_a": "Where is the Eiffel Tower?", "text_b": "The Eiffel Tower is in Paris.",
                 "label": 0}]
    assert get_task("qnli").read("dev", tmp_path, cache_dir=cache).to_list() == expected
    assert get_task("qnli").read("dev", tmp_path / "qnli", cache_dir=cache).to_list() == expected


def test_hub_layout_swag(tmp_path, cache):
    row = {"video-id": ["anetv_x"], "fold-ind": ["1"], "startphrase": ["A man waves. He"], "sent1": ["A man waves."],
           "sent2": ["He"], "gold-source": ["gold"], "ending0": ["smiles."], "ending1": ["runs."],
           "ending2": ["sits."], "ending3": ["jumps."], "label": [3]}
    write_parquet(tmp_path / "regular" / "validation-00000-of-00001.parquet", row)
    data = get_task("swag").read("dev", tmp_path, cache_dir=cache)
    assert data.to_list() == [{"idx": 0, "context": "A man waves.", "start": "He",
                               "endings": ["smiles.", "runs.", "sits.", "jumps."], "label": 3}]


def test_hub_layout_bad_rows(tmp_path, cache):
    write_parquet(tmp_path / "rte" / "train-00000-of-00001.parquet",
                  {"sentence1": ["A.", "B."], "sentence2": ["C.", "D."], "label": [1, 2], "idx": [0, 1]})
    with pytest.raises(ValueError, match=r"rte train: .*row 2: label 2 is not a rte label id \(0..1\)"):
        get_task("rte").read("train", tmp_path, cache_dir=cache)
    write_parquet(tmp_path / "rte" / "validation-00000-of-00001.parquet",
                  {"sentence1": ["A.", None], "sentence2": ["C.", "D."], "label": [1, 0], "idx": [0, 1]})
    with pytest.raises(ValueError, match=r"row 2: column 'sentence1' is missing"):
        get_task("rte").read("dev", tmp_path, cache_dir=cache)
    write_parquet(tmp_path / "other" / "rte" / "test-00000-of-00001.parquet",
                  {"sentence1": ["A."], "label": [-1], "idx": [0]})
    with pytest.raises(ValueError, match=r"no column\(s\) \['sentence2'\] \(columns: sentence1, label, idx\)"):
        get_task("rte").read("test", tmp_path / "other", cache_dir=cache)
    with pytest.raises(FileNotFoundError, match="mnli dev_matched"):
        get_task("mnli").read("dev_matched", tmp_path, cache_dir=cache)


def test_hub_name_offline_is_a_clear_file_not_found(cache):
    with pytest.raises(FileNotFoundError, match="cannot be reached.*Pass the split's file"):
        get_task("sst2").read("dev", "nyu-mll/glue-not-a-real-copy", cache_dir=cache)
