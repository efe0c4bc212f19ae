"""Fine-tuning end to end on real task data: each task family overfits a few hundred examples through the whole path
(reading, features, model, predictions, metric), which catches label-order and alignment bugs that loss curves hide;
what a run leaves behind; and the errors a user gets before anything trains."""
from __future__ import annotations

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import csv  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from pipeline.core.app import compose  # noqa: E402
from pipeline.finetuning.run import finetune  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLE_SST2 = REPO_ROOT / "pipeline" / "finetuning" / "sample_data" / "SST-2"


def overfit_overrides(task: str, init: Path, tmp_path: Path, train: Path, dev: Path | None = None, examples: int = 200,
                      epochs: int = 25, extra: tuple[str, ...] = ()) -> list[str]:
    """Train and evaluate on the same `examples` rows, with a high rate and no dropout: a working path memorises
    them; a wrong label order or misaligned features cannot score well on the rows it was trained on."""
    return [f"task={task}", f"init={init}", f"output_dir={tmp_path / 'run'}", f"data.train={train}",
            f"data.dev={dev or train}", f"data.cache_dir={tmp_path / 'cache'}", f"data.limit_train_examples={examples}",
            f"data.limit_eval_examples={examples}", "data.batch_size=16", f"trainer.max_epochs={epochs}",
            "trainer.enable_progress_bar=false", "optimizer.lr=1e-3", "model.hidden_dropout=0.0",
            "model.attention_dropout=0.0", "data.group_by_length=true", *extra]


@pytest.fixture(scope="module")
def sst2_run(tiny_bert_dir, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("sst2")
    data = tmp_path / "SST-2"
    data.mkdir()
    shutil.copy(SAMPLE_SST2 / "train.tsv", data / "train.tsv")
    # a test file in GLUE's layout (index, sentence; no label): the leaderboard file comes from it
    (data / "test.tsv").write_text("index\tsentence\n0\ta gorgeous , witty , seductive movie .\n"
                                   "1\tthe acting is dreadful .\n2\tit 's a charming journey .\n")
    overrides = overfit_overrides("sst2", tiny_bert_dir, tmp_path, data / "train.tsv",
                                  extra=(f"data.test={data / 'test.tsv'}",))
    return finetune(compose("finetune", overrides)), tmp_path / "run"


def test_single_sentence_classification_overfits(sst2_run):
    result, _ = sst2_run
    assert result["metrics"]["dev"]["acc"] >= 0.97, result["metrics"]


@pytest.mark.slow
def test_sentence_pair_classification_overfits(tiny_bert_dir, tmp_path, shared_data):
    qnli = shared_data / "downstream" / "glue" / "QNLI" / "dev.tsv"
    result = finetune(compose("finetune", overfit_overrides("qnli", tiny_bert_dir, tmp_path, qnli)))
    assert result["metrics"]["dev"]["acc"] >= 0.95, result["metrics"]


@pytest.mark.slow
def test_regression_overfits(tiny_bert_dir, tmp_path, shared_data):
    stsb = shared_data / "downstream" / "glue" / "STS-B" / "sts-dev.csv"
    result = finetune(compose("finetune", overfit_overrides("stsb", tiny_bert_dir, tmp_path, stsb)))
    assert result["metrics"]["dev"]["pearson"] >= 0.95, result["metrics"]
    assert result["metrics"]["dev"]["spearman"] >= 0.9, result["metrics"]


def test_multiple_choice_overfits(tiny_bert_dir, tmp_path, shared_data):
    swag = shared_data / "downstream" / "swag" / "allennlp_fixture_swag_val_sample.csv"
    result = finetune(compose("finetune", overfit_overrides("swag", tiny_bert_dir, tmp_path, swag, epochs=40)))
    assert result["metrics"]["dev"]["acc"] == 1.0, result["metrics"]


def test_run_leaves_metrics_predictions_submission_log_plot_and_export(sst2_run):
    result, out = sst2_run
    record = json.loads((out / "metrics.json").read_text())
    assert record["task"] == "sst2" and record["main_metric"] == "acc"
    assert record["score"] == result["metrics"]["dev"]["acc"]
    assert record["hyperparameters"]["lr"] == 1e-3 and record["hyperparameters"]["batch_size"] == 16
    assert record["data"]["train"]["examples"] == 200 and record["data"]["train"]["examples_truncated"] == 0
    assert "encoder" in record["weights_loaded"]

    with open(out / "predictions" / "dev.tsv", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    assert len(rows) == 200
    assert {row["prediction"] for row in rows} <= {"0", "1"}
    accuracy = sum(row["prediction"] == row["label"] for row in rows) / len(rows)
    assert accuracy == pytest.approx(record["score"])

    submission = (out / "glue_submission" / "SST-2.tsv").read_text().splitlines()
    assert submission[0] == "index\tprediction" and [line.split("\t")[0] for line in submission[1:]] == ["0", "1", "2"]

    with open(out / "csv" / "metrics.csv", newline="") as handle:
        logged = {key for row in csv.DictReader(handle) for key, value in row.items() if value}
    assert {"train/loss", "train/lr", "dev/acc", "dev/loss"} <= logged
    assert (out / "curves.png").stat().st_size > 10_000


def test_export_loads_in_transformers_with_label_names_and_agrees(sst2_run):
    transformers = pytest.importorskip("transformers")
    import torch

    _, out = sst2_run
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out / "hf_export").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out / "hf_export")
    assert model.config.id2label == {0: "negative", 1: "positive"}
    with open(out / "predictions" / "dev.tsv", newline="") as handle:
        expected = [row["prediction"] for row in csv.DictReader(handle, delimiter="\t")][:20]
    sentences = [line.split("\t")[0] for line in (SAMPLE_SST2 / "train.tsv").read_text().splitlines()[1:21]]
    with torch.no_grad():
        logits = model(**tokenizer(sentences, padding=True, return_tensors="pt")).logits
    assert [str(i) for i in logits.argmax(-1).tolist()] == expected


def test_featurized_splits_are_cached(tiny_bert_dir, tmp_path):
    from pipeline.finetuning.features import featurize
    from pipeline.finetuning.tasks import get_task
    from pipeline.finetuning.tokenizer import load_tokenizer

    task, tokenizer = get_task("sst2"), load_tokenizer(tiny_bert_dir, 30522)
    rows = task.read("train", str(SAMPLE_SST2 / "train.tsv"), cache_dir=str(tmp_path))
    first = featurize(rows, task.kind, tokenizer, 128)
    cache_file = Path(first.cache_files[0]["filename"])
    written = cache_file.stat().st_mtime_ns
    again = featurize(task.read("train", str(SAMPLE_SST2 / "train.tsv"), cache_dir=str(tmp_path)), task.kind,
                      tokenizer, 128)
    assert again.cache_files[0]["filename"] == str(cache_file) and cache_file.stat().st_mtime_ns == written
    assert featurize(rows, task.kind, tokenizer, 64).cache_files[0]["filename"] != str(cache_file)


@pytest.mark.parametrize("overrides, error, message", [
    (["task=nope"], Exception, "nope"),
    ([], ValueError, "init= is required"),
    (["init={bert}", "data.dir=null"], ValueError, "pass data.dir="),
    (["init={bert}", "data.train=/nonexistent/train.tsv"], FileNotFoundError, "train data of task sst2 not found"),
    (["init={bert}", "data.max_seq_length=512"], ValueError, "exceeds the model's max_position_embeddings=128"),
    (["init={bert}", "data.batch_size=0"], ValueError, "data.batch_size=0"),
])
def test_mistakes_stop_before_training(tiny_bert_dir, tmp_path, monkeypatch, overrides, error, message):
    monkeypatch.delenv("GLUE_DIR", raising=False)
    overrides = [o.format(bert=tiny_bert_dir) for o in overrides] + [f"output_dir={tmp_path}"]
    with pytest.raises(error, match=message):
        finetune(compose("finetune", overrides))


def test_every_task_config_composes_and_names_a_task():
    from pipeline.finetuning.tasks import get_task

    for path in sorted((REPO_ROOT / "conf" / "task").glob("*.yaml")):
        cfg = compose("finetune", [f"task={path.stem}", "output_dir=/tmp/x"])
        assert get_task(cfg.task.name).name == cfg.task.name, path.name
    large = compose("finetune", ["task=squad_v1_bert_large", "output_dir=/tmp/x"])
    assert (large.optimizer.lr, large.trainer.max_epochs, large.data.max_seq_length) == (3e-5, 2, 384)


def test_mnli_evaluates_matched_and_mismatched_and_writes_m_mm_and_ax(tiny_bert_dir, tmp_path):
    """GLUE's MNLI layout (hand-written files in GLUE's exact format): two dev sets, three leaderboard files."""
    mnli = Path(__file__).parent / "fixtures" / "glue" / "MNLI"
    overrides = ["task=mnli", f"init={tiny_bert_dir}", f"output_dir={tmp_path / 'run'}", f"data.dir={mnli}",
                 f"data.cache_dir={tmp_path / 'cache'}", "trainer.max_epochs=1", "trainer.enable_progress_bar=false"]
    result = finetune(compose("finetune", overrides))
    assert set(result["metrics"]) == {"dev_matched", "dev_mismatched"}
    out = tmp_path / "run"
    for name, split in (("MNLI-m.tsv", "test_matched"), ("MNLI-mm.tsv", "test_mismatched"), ("AX.tsv", "ax")):
        lines = (out / "glue_submission" / name).read_text().splitlines()
        assert lines[0] == "index\tprediction", name
        assert {line.split("\t")[1] for line in lines[1:]} <= {"entailment", "neutral", "contradiction"}, name
        with open(mnli / get_split_file(split)) as handle:
            assert len(lines) == len(handle.read().splitlines()), name   # header + one line per row
    predictions = (out / "predictions" / "dev_mismatched.tsv").read_text().splitlines()
    assert predictions[0] == "idx\tprediction\tlabel"


def get_split_file(split: str) -> str:
    from pipeline.finetuning.tasks import get_task
    return get_task("mnli").splits[split]


def test_truncation_is_counted_and_reported(tiny_bert_dir, tmp_path):
    overrides = ["task=sst2", f"init={tiny_bert_dir}", f"output_dir={tmp_path / 'run'}",
                 f"data.dir={SAMPLE_SST2}", f"data.cache_dir={tmp_path / 'cache'}", "data.max_seq_length=8",
                 "data.limit_train_examples=100", "data.limit_eval_examples=100", "trainer.max_epochs=1",
                 "trainer.enable_progress_bar=false", "export.hf=false", "export.plot=false"]
    finetune(compose("finetune", overrides))
    report = json.loads((tmp_path / "run" / "metrics.json").read_text())["data"]
    lengths = [len(line.split()) for line in (SAMPLE_SST2 / "train.tsv").read_text().splitlines()[1:101]]
    assert 0 < report["train"]["examples_truncated"] <= 100
    assert report["train"]["examples_truncated"] >= sum(n > 6 for n in lengths)   # > 6 words is > 6 word pieces
    assert report["train"]["tokens_cut"] >= sum(max(0, n - 6) for n in lengths)


def test_wandb_offline_run_logs_dev_metrics_in_the_run_directory(tiny_bert_dir, tmp_path, monkeypatch,
                                                                read_wandb_history):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))   # the rest goes into the run directory
    overrides = ["task=sst2", f"init={tiny_bert_dir}", f"output_dir={tmp_path / 'run'}",
                 f"data.dir={SAMPLE_SST2}", f"data.cache_dir={tmp_path / 'cache'}", "data.limit_train_examples=64",
                 "data.limit_eval_examples=64", "trainer.max_epochs=1", "trainer.enable_progress_bar=false",
                 "logger=wandb_offline", "logger.group=sst2-sweep", "export.hf=false",
                 "trainer.log_every_n_steps=1"]
    finetune(compose("finetune", overrides))
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    history = read_wandb_history(runs[0])
    assert any("dev/acc" in row for row in history) and any("train/loss" in row for row in history)


def test_ner_overfits_through_the_whole_path_and_writes_conll_predictions(tiny_bert_dir, tmp_path):
    """The hand-written CoNLL-2003 fixture (IOB1: I- tags that start entities, adjacent same-type entities): trained
    and scored on the same sentences, entity F1 reaches 1 only if first-sub-token alignment and IOB handling are
    right."""
    conll = Path(__file__).parent / "fixtures" / "conll2003" / "eng.train"
    overrides = ["task=conll2003", f"init={tiny_bert_dir}", f"output_dir={tmp_path / 'run'}", f"data.train={conll}",
                 f"data.dev={conll}", f"data.test={conll}", f"data.cache_dir={tmp_path / 'cache'}",
                 "data.batch_size=8", "trainer.max_epochs=60", "trainer.enable_progress_bar=false",
                 "optimizer.lr=2e-3", "model.hidden_dropout=0.0", "model.attention_dropout=0.0"]
    result = finetune(compose("finetune", overrides))
    assert result["metrics"]["dev"]["f1"] == 1.0, result["metrics"]
    written = (tmp_path / "run" / "predictions" / "dev" / "predictions.conll").read_text().splitlines()
    gold_tokens = [line.split()[0] for line in conll.read_text().splitlines() if line.strip()]
    assert [line.split()[0] for line in written if line.strip()] == gold_tokens
    assert all(line.split()[1] == line.split()[2] for line in written if line.strip())
    transformers = pytest.importorskip("transformers")
    exported = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "run" / "hf_export")
    assert exported.config.id2label[1] == "B-PER"


@pytest.mark.slow
def test_squad_overfits_a_slice_of_the_real_dev_set_and_writes_the_reference_files(tiny_bert_dir, tmp_path,
                                                                                   shared_data):
    """A few hundred real questions, trained and evaluated on the same ones: a wrong offset or an off-by-one span
    shows up as a low exact match here and nowhere else."""
    dev = shared_data / "downstream" / "squad" / "dev-v1.1.json"
    overrides = ["task=squad_v1", f"init={tiny_bert_dir}", f"output_dir={tmp_path / 'run'}", f"data.train={dev}",
                 f"data.dev={dev}", f"data.cache_dir={tmp_path / 'cache'}", "data.limit_train_examples=200",
                 "data.limit_eval_examples=200", "data.max_seq_length=128", "task.max_query_length=32",
                 "task.doc_stride=64", "data.batch_size=16", "trainer.max_epochs=60",
                 "trainer.enable_progress_bar=false", "optimizer.lr=1e-3", "model.hidden_dropout=0.0",
                 "model.attention_dropout=0.0", "data.group_by_length=true"]
    result = finetune(compose("finetune", overrides))
    assert result["metrics"]["dev"]["exact_match"] >= 90 and result["metrics"]["dev"]["f1"] >= 93, result["metrics"]
    predictions = json.loads((tmp_path / "run" / "predictions" / "dev" / "predictions.json").read_text())
    nbest = json.loads((tmp_path / "run" / "predictions" / "dev" / "nbest_predictions.json").read_text())
    assert len(predictions) == 200 and set(nbest) == set(predictions)
    first = next(iter(nbest.values()))
    assert set(first[0]) == {"text", "probability", "start_logit", "end_logit"} and len(first) <= 20
    report = json.loads((tmp_path / "run" / "metrics.json").read_text())["data"]
    assert report["train"]["examples"] == 200 and report["train"]["features"] >= 200
