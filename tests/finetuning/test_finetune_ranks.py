"""Fine-tuning's evaluation on 2 CPU processes (DDP over gloo) writes what one process writes.

For each task family a tiny model is fine-tuned and saved (its hf_export/), then evaluated as it is
(trainer.max_epochs=0) by `python pipeline/finetune.py` with trainer.devices=2, and in this process with one device.
The splits have an odd number of rows and an odd last batch per rank, so validation's DistributedSampler repeats a
row to even out the ranks' shares and predict's sampler splits them unevenly. Every output file must hold each row
once, in input order, and be the same from both runs; every metric the same, the dev loss included. The ranks pad
their batches to other lengths, which moves the logits in their last bits: floats agree to 1e-5 (relative), a
regression score printed to 3 decimals to 0.001; everything else byte for byte.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.app import compose
from pipeline.finetuning.run import finetune
from tests.helpers.ranks import local_launch_env, run_rank_group

FIXTURES = Path(__file__).parent / "fixtures"
TWO_RANK_TIMEOUT_S = 900


def glue_test_file(source: Path, out: Path, rows: int, column: int) -> Path:
    """A test split in GLUE's layout (index, sentence; no label), from the first `rows` sentences of a labelled file:
    the leaderboard file is written from it."""
    lines = source.read_text(encoding="utf-8").splitlines()
    sentences = [line.split("\t")[column] for line in lines[1:rows + 1]]
    out.write_text("index\tsentence\n" + "".join(f"{i}\t{s}\n" for i, s in enumerate(sentences)), encoding="utf-8")
    return out


@dataclasses.dataclass
class Family:
    task: str
    train: str                # the fine-tuning's training data (an override); evaluation runs without it
    data: list[str]           # the evaluation data and the task's settings (overrides)
    rows: int                 # the split's rows (data.limit_*_examples)
    eval_batch: int           # per device
    epochs: int               # of fine-tuning: enough for predictions that differ between rows
    expected: dict[str, int]  # output file -> its data rows


# Rows: 21 (SST-2, STS-B: 11 + 10 per rank, batches 4 4 3), 11 (SWAG: 6 + 5, batches 5 1), 7 SQuAD questions in 21
# windows (11 + 10, batches 4 4 3), 7 CoNLL sentences (4 + 3, batches 3 1). The model learns its dev rows (also the
# test rows), so its predictions differ from row to row: rows out of order could not go unseen.
def family(name: str, shared_data: Path, tmp_path: Path) -> Family:
    glue, downstream = shared_data / "downstream" / "glue", shared_data / "downstream"
    if name == "sst2":
        dev = glue / "SST-2" / "dev.tsv"
        test = glue_test_file(dev, tmp_path / "sst2-test.tsv", 21, column=0)
        return Family("sst2", f"data.train={dev}", [f"data.dev={dev}", f"data.test={test}"], 21, 4, 8,
                      {"predictions/dev.tsv": 21, "glue_submission/SST-2.tsv": 21})
    if name == "stsb":
        dev = glue / "STS-B" / "sts-dev.csv"   # as the test split too: the original release's test file has scores
        return Family("stsb", f"data.train={dev}", [f"data.dev={dev}", f"data.test={dev}"], 21, 4, 20,
                      {"predictions/dev.tsv": 21, "glue_submission/STS-B.tsv": 21})
    if name == "swag":
        val = downstream / "swag" / "allennlp_fixture_swag_val_sample.csv"
        return Family("swag", f"data.train={val}", [f"data.dev={val}"], 11, 5, 8, {"predictions/dev.tsv": 11})
    if name == "squad":
        dev = downstream / "squad" / "dev-v1.1.json"
        return Family("squad_v1", f"data.train={dev}", [f"data.dev={dev}", "data.max_seq_length=96",
                                                        "task.doc_stride=48", "task.max_query_length=32"], 7, 4, 10,
                      {"predictions/dev/predictions.json": 7, "predictions/dev/nbest_predictions.json": 7})
    if name == "conll":
        iob1, iob2 = FIXTURES / "conll2003" / "eng.train", FIXTURES / "conll2003" / "train.txt"
        return Family("conll2003", f"data.train={iob1}", [f"data.dev={iob1}", f"data.test={iob2}"], 7, 3, 10,
                      {"predictions/dev/predictions.conll": 7, "predictions/test/predictions.conll": 7})
    raise ValueError(name)


def overrides(setup: Family, out: Path, cache: Path) -> list[str]:
    return [f"task={setup.task}", "data.dir=null", *setup.data, f"output_dir={out}", f"data.cache_dir={cache}",
            f"data.limit_train_examples={setup.rows}", f"data.limit_eval_examples={setup.rows}",
            "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "export.plot=false"]


def fine_tuned_model(tiny_bert_dir: Path, setup: Family, tmp_path: Path) -> Path:
    """A tiny BERT fine-tuned on the rows it is then evaluated on, saved as its run's hf_export/ (encoder and head)."""
    finetune(compose("finetune", [*overrides(setup, tmp_path / "fine-tune", tmp_path / "cache"), setup.train,
                                  f"init={tiny_bert_dir}", "data.batch_size=4", f"trainer.max_epochs={setup.epochs}",
                                  "optimizer.lr=1e-3", "model.hidden_dropout=0.0", "model.attention_dropout=0.0"]))
    return tmp_path / "fine-tune" / "hf_export"


def evaluate_on_two_ranks(arguments: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """`python pipeline/finetune.py <arguments> trainer.devices=2`: Lightning starts rank 1 itself."""
    env = local_launch_env(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_DATASETS_DISABLE_PROGRESS_BARS="1")
    command = [sys.executable, "pipeline/finetune.py", *arguments, "trainer.devices=2", "trainer.accelerator=cpu",
               f"hydra.run.dir={tmp_path / 'hydra'}"]
    return run_rank_group(command, env, TWO_RANK_TIMEOUT_S)


# ---------------------------------------------------------------------------------------------- the comparison

def data_rows(path: Path) -> int:
    """A prediction file's rows: lines after the header (TSV), questions (SQuAD JSON), sentences (CoNLL)."""
    if path.suffix == ".json":
        return len(json.loads(path.read_text(encoding="utf-8")))
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".conll":
        blocks = [block for block in text.split("\n\n") if block.strip()]
        return sum(not block.startswith("-DOCSTART-") for block in blocks)
    return len(text.splitlines()) - 1


def output_files(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for folder in ("predictions", "glue_submission")
                  for p in (run / folder).rglob("*") if p.is_file())


def assert_same_tsv(one: Path, two: Path, float_column: str | None) -> None:
    """Byte for byte, except a regression score, printed to 3 decimals: there the two may differ in the last digit
    (the ranks pad their batches differently, which moves the logits by about 1e-7)."""
    if float_column is None:
        assert one.read_bytes() == two.read_bytes(), f"{one} and {two} differ"
        return
    with open(one, newline="") as a, open(two, newline="") as b:
        rows_one, rows_two = list(csv.DictReader(a, delimiter="\t")), list(csv.DictReader(b, delimiter="\t"))
    assert len(rows_one) == len(rows_two)
    for x, y in zip(rows_one, rows_two):
        assert {k: v for k, v in x.items() if k != float_column} == {k: v for k, v in y.items() if k != float_column}
        assert float(x[float_column]) == pytest.approx(float(y[float_column]), abs=1e-3), (x, y)


def assert_same_nbest(one: Path, two: Path) -> None:
    a, b = (json.loads(p.read_text(encoding="utf-8")) for p in (one, two))
    assert list(a) == list(b)                       # the same questions, in the same order
    for question in a:
        assert [c["text"] for c in a[question]] == [c["text"] for c in b[question]], question
        for x, y in zip(a[question], b[question]):
            for key in ("probability", "start_logit", "end_logit"):
                assert x[key] == pytest.approx(y[key], rel=1e-5, abs=1e-6), (question, key)


def logged(run: Path) -> dict[str, float]:
    with open(run / "csv" / "metrics.csv", newline="") as handle:
        return {key: float(value) for row in csv.DictReader(handle) for key, value in row.items()
                if value and key not in ("epoch", "step")}


def compare_runs(one: Path, two: Path, expected: dict[str, int], regression: bool) -> dict[str, tuple[int, int]]:
    """Asserts the two runs' outputs and metrics agree and each file holds its expected rows; returns
    file -> (rows from 1 rank, rows from 2 ranks)."""
    assert output_files(one) == output_files(two) == sorted(expected)
    counts = {name: (data_rows(one / name), data_rows(two / name)) for name in expected}
    assert counts == {name: (rows, rows) for name, rows in expected.items()}
    for name in expected:
        if name.endswith("nbest_predictions.json"):
            assert_same_nbest(one / name, two / name)
        elif name.endswith(".tsv"):
            assert_same_tsv(one / name, two / name, "prediction" if regression else None)
        else:
            assert (one / name).read_bytes() == (two / name).read_bytes(), f"{name} differs"
    metrics_one, metrics_two = (json.loads((run / "metrics.json").read_text())["metrics"] for run in (one, two))
    assert metrics_one.keys() == metrics_two.keys()
    for split in metrics_one:   # the ranks pad their batches differently, which moves the logits by about 1e-7
        assert metrics_two[split] == pytest.approx(metrics_one[split], rel=1e-5), (split, metrics_one, metrics_two)
    assert logged(two) == pytest.approx(logged(one), rel=1e-5)   # dev/loss and every metric, as logged
    return counts


def assert_predictions_vary(run: Path, name: str) -> None:
    """A model that predicts one label everywhere would hide rows written in the wrong order."""
    with open(run / name, newline="") as handle:
        assert len({row["prediction"] for row in csv.DictReader(handle, delimiter="\t")}) > 1, name


# ---------------------------------------------------------------------------------------------- the tests

def run_family(name: str, shared_data: Path, tiny_bert_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The saved model evaluated on 1 rank (here) and on 2 (`python pipeline/finetune.py`); their outputs compared."""
    setup = family(name, shared_data, tmp_path)
    init = fine_tuned_model(tiny_bert_dir, setup, tmp_path)
    # evaluation only (trainer.max_epochs=0): no training data
    evaluation = ["trainer.max_epochs=0", f"init={init}", f"data.eval_batch_size={setup.eval_batch}", "export.hf=false"]
    one, two = tmp_path / "one-rank", tmp_path / "two-ranks"
    finetune(compose("finetune", [*overrides(setup, one, tmp_path / "cache"), *evaluation]))
    proc = evaluate_on_two_ranks([*overrides(setup, two, tmp_path / "cache"), *evaluation], tmp_path)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert "task head" in json.loads((two / "metrics.json").read_text())["weights_loaded"]   # the saved model's
    counts = compare_runs(one, two, setup.expected, regression=setup.task == "stsb")
    print(name, "rows of each file (1 rank, 2 ranks):", counts)
    return one, two


@pytest.mark.slow
def test_glue_classification_dev_and_leaderboard_files_are_the_same_on_two_ranks(shared_data, tiny_bert_dir,
                                                                                  tmp_path):
    one, _ = run_family("sst2", shared_data, tiny_bert_dir, tmp_path)
    assert_predictions_vary(one, "glue_submission/SST-2.tsv")
    submission = (one / "glue_submission" / "SST-2.tsv").read_text().splitlines()
    assert [line.split("\t")[0] for line in submission[1:]] == [str(i) for i in range(21)]   # input order


@pytest.mark.slow
def test_regression_dev_and_leaderboard_files_are_the_same_on_two_ranks(shared_data, tiny_bert_dir, tmp_path):
    one, _ = run_family("stsb", shared_data, tiny_bert_dir, tmp_path)
    assert_predictions_vary(one, "glue_submission/STS-B.tsv")


@pytest.mark.slow
def test_multiple_choice_dev_predictions_are_the_same_on_two_ranks(shared_data, tiny_bert_dir, tmp_path):
    one, _ = run_family("swag", shared_data, tiny_bert_dir, tmp_path)
    assert_predictions_vary(one, "predictions/dev.tsv")


@pytest.mark.slow
def test_squad_predictions_and_nbest_are_the_same_on_two_ranks(shared_data, tiny_bert_dir, tmp_path):
    one, two = run_family("squad", shared_data, tiny_bert_dir, tmp_path)
    report = json.loads((two / "metrics.json").read_text())["data"]["dev"]
    assert report["examples"] == 7 and report["features"] == 21   # 21 windows: 11 + 10 over two ranks
    predictions = json.loads((one / "predictions" / "dev" / "predictions.json").read_text())
    assert len(set(predictions.values())) > 1


@pytest.mark.slow
def test_conll_predictions_are_the_same_on_two_ranks(shared_data, tiny_bert_dir, tmp_path):
    one, _ = run_family("conll", shared_data, tiny_bert_dir, tmp_path)
    tags = {line.split()[2] for line in (one / "predictions" / "dev" / "predictions.conll").read_text().splitlines()
            if line.strip() and not line.startswith("-DOCSTART-")}
    assert len(tags) > 1


def test_a_row_repeated_by_the_sampler_counts_once_and_a_row_no_rank_saw_is_an_error():
    from pipeline.finetuning.gather import rows_on_rank_zero  # here: the file's other tests also run on older code

    assert rows_on_rank_zero([2, 0, 1, 0], ["c", "a", "b", "a"], 3, "sst2 dev") == ["a", "b", "c"]
    with pytest.raises(RuntimeError, match="sst2 dev: 1 of 3 rows were not evaluated"):
        rows_on_rank_zero([2, 0], ["c", "a"], 3, "sst2 dev")
