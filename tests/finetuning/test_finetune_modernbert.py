"""Fine-tuning from a ModernBERT checkpoint, as a user runs it: `init=` a transformers ModernBERT directory (with its
byte-level BPE tokenizer.json) for every task family, through the real finetune(); the run's hf_export/ loads with
transformers' AutoModelFor<task> and gives our model's logits; the BERT-only settings are mapped or refused."""
from __future__ import annotations

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import csv  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from pipeline.core.app import compose  # noqa: E402
from pipeline.finetuning.run import finetune  # noqa: E402
from tests.finetuning.modernbert_dirs import SAMPLE_SST2, save_tiny_modernbert  # noqa: E402

CONLL = Path(__file__).parent / "fixtures" / "conll2003" / "eng.train"
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def modernbert_dir(tmp_path_factory) -> Path:
    return save_tiny_modernbert(tmp_path_factory.mktemp("modernbert") / "hf")


def run(task: str, init: Path, out: Path, train, dev=None, *extra: str) -> dict:
    overrides = [f"task={task}", f"init={init}", f"output_dir={out}", f"data.train={train}", f"data.dev={dev or train}",
                 f"data.cache_dir={out.parent / 'cache'}", "trainer.enable_progress_bar=false", *extra]
    return finetune(compose("finetune", overrides))


@pytest.fixture(scope="module")
def sst2_run(modernbert_dir, tmp_path_factory):
    """Trained and scored on the same 64 sentences without dropout: a working path memorises them."""
    out = tmp_path_factory.mktemp("sst2") / "run"
    result = run("sst2", modernbert_dir, out, SAMPLE_SST2 / "train.tsv", None, "data.limit_train_examples=64",
                 "data.limit_eval_examples=64", "data.batch_size=16", "trainer.max_epochs=8", "optimizer.lr=1e-3",
                 "model.hidden_dropout=0.0", "model.attention_dropout=0.0")
    return result, out


def test_sst2_from_a_transformers_modernbert_directory_overfits(sst2_run):
    result, out = sst2_run
    assert result["metrics"]["dev"]["acc"] >= 0.95, result["metrics"]
    record = json.loads((out / "metrics.json").read_text())
    assert record["weights_loaded"] == ("encoder; prediction head (head.dense.weight, head.norm.weight); new "
                                        "classifier")
    assert record["hyperparameters"]["classifier_dropout"] == 0.0 and "hidden_dropout" not in record["hyperparameters"]


def test_the_sst2_export_runs_in_transformers_pipeline_with_our_predictions(sst2_run):
    _, out = sst2_run
    export = out / "hf_export"
    model = transformers.AutoModelForSequenceClassification.from_pretrained(export).eval()
    assert type(model).__name__ == "ModernBertForSequenceClassification"
    assert model.config.id2label == {0: "negative", 1: "positive"}
    with open(out / "predictions" / "dev.tsv", newline="") as handle:
        expected = {int(row["idx"]): row["prediction"] for row in csv.DictReader(handle, delimiter="\t")}
    sentences = [line.split("\t")[0] for line in (SAMPLE_SST2 / "train.tsv").read_text().splitlines()[1:17]]
    classify = transformers.pipeline("text-classification", model=str(export), device="cpu")
    names = {"negative": "0", "positive": "1"}
    assert [names[p["label"]] for p in classify(sentences)] == [expected[i] for i in range(16)]


def ours_and_theirs(export: Path, task_kind: str, num_labels: int, auto_class: str, batch: dict):
    """Our task model loaded from the export (as init= of a run resuming it) and transformers' AutoModelFor*, both
    run on `batch`: (our logits, theirs as ours are laid out)."""
    from pipeline.core.checkpoints.weights import load_into_task_model, load_pretrained
    from pipeline.finetuning.module import build_task_model

    pretrained = load_pretrained(export)
    ours = build_task_model(pretrained.config, task_kind, num_labels).eval()
    assert load_into_task_model(ours, pretrained).startswith("encoder; task head")
    theirs = getattr(transformers, auto_class).from_pretrained(export).eval()
    with torch.no_grad():
        our_logits = ours(batch["input_ids"], None, batch["attention_mask"]).logits
        output = theirs(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    if auto_class == "AutoModelForQuestionAnswering":
        return our_logits, torch.stack([output.start_logits, output.end_logits], dim=-1)
    return our_logits, output.logits


TASKS = {   # task -> (its training file under the shared data, AutoModelFor*, extra overrides)
    "stsb": ("glue/STS-B/sts-dev.csv", "AutoModelForSequenceClassification", ()),
    "swag": ("swag/allennlp_fixture_swag_val_sample.csv", "AutoModelForMultipleChoice", ()),
    "squad_v1": ("squad/dev-v1.1.json", "AutoModelForQuestionAnswering",
                 ("data.max_seq_length=128", "task.max_query_length=32", "task.doc_stride=64")),
    "conll2003": (None, "AutoModelForTokenClassification", (f"data.test={CONLL}",)),   # its test split is required
}


@pytest.mark.parametrize("task", list(TASKS))
def test_each_task_fine_tunes_a_few_steps_and_its_export_gives_our_logits(task, modernbert_dir, tmp_path,
                                                                         shared_data):
    from pipeline.finetuning.batches import FeatureRows, PaddingCollator
    from pipeline.finetuning.checks import FinetuneChecks
    from pipeline.finetuning.run import _featurized_splits

    relative, auto_class, extra = TASKS[task]
    train = CONLL if relative is None else shared_data / "downstream" / relative
    overrides = ("data.limit_train_examples=16", "data.limit_eval_examples=16", "data.batch_size=4",
                 "trainer.max_epochs=1", "export.plot=false", *extra)
    result = run(task, modernbert_dir, tmp_path / "run", train, None, *overrides)
    assert result["global_step"] >= 2 and result["metrics"]["dev"], result
    export = tmp_path / "run" / "hf_export"
    assert json.loads((export / "config.json").read_text())["model_type"] == "modernbert"

    # the dev rows as the run featurized them, batched as it batches them
    cfg = compose("finetune", [f"task={task}", f"init={export}", f"output_dir={tmp_path / 'again'}",
                               f"data.train={train}", f"data.dev={train}", f"data.cache_dir={tmp_path / 'cache'}",
                               *overrides])
    plan = FinetuneChecks(cfg)
    _, features, _ = _featurized_splits(cfg, plan)
    rows = FeatureRows(features["dev"], plan.task.kind)
    batch = PaddingCollator(plan.tokenizer.pad_id)([rows[i] for i in range(min(6, len(rows)))])
    labels = len(plan.task.label_names) if plan.task.label_names else 1
    ours, theirs = ours_and_theirs(export, plan.task.kind, labels, auto_class, batch)
    if plan.task.kind in ("span", "token"):   # per token: the real tokens' (padding's scores mean nothing)
        real = batch["attention_mask"].bool()
        ours, theirs = ours[real], theirs[real]
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)


def test_bert_settings_map_onto_modernbert_and_others_are_refused(modernbert_dir, tmp_path):
    from pipeline.finetuning.checks import FinetuneChecks

    base = ["task=sst2", f"init={modernbert_dir}", f"output_dir={tmp_path}", f"data.dir={SAMPLE_SST2}"]
    plan = FinetuneChecks(compose("finetune", [*base, "model.hidden_dropout=0.2", "+model.classifier_dropout=0.3"]))
    config = plan.model_config
    assert (config.embedding_dropout, config.mlp_dropout, config.attention_dropout,
            config.classifier_dropout) == (0.2, 0.2, 0.1, 0.3)
    assert plan.tokenizer.lowercase is False and plan.tokenizer.cls_id == config.cls_token_id
    with pytest.raises(ValueError, match="model.layer_norm_eps is not a setting of a ModernBERT model"):
        FinetuneChecks(compose("finetune", [*base, "+model.layer_norm_eps=1e-6"]))


def test_a_modernbert_pretraining_run_fine_tunes_from_its_directory_checkpoint_and_export(modernbert_dir, tmp_path,
                                                                                        shared_data, tiny_overrides):
    """The whole user path: data prep with the BPE tokenizer.json, a few steps of ModernBERT pre-training, then init=
    its run directory, its last.ckpt and its hf_export/ give the same encoder and tokenizer, and fine-tuning runs."""
    from pipeline.core.checkpoints.weights import load_pretrained
    from pipeline.pretraining.run import train
    from tests.finetuning.modernbert_dirs import bpe_shard_set, modernbert_model

    shards = bpe_shard_set(shared_data, modernbert_dir / "tokenizer.json", tmp_path)
    pretraining = tmp_path / "pretraining"
    train(compose("train", tiny_overrides(shards, pretraining, 3, *modernbert_model(shards))))
    resolved = [load_pretrained(init) for init in (pretraining, pretraining / "checkpoints" / "last.ckpt",
                                                   pretraining / "hf_export")]
    for pretrained in resolved:
        assert pretrained.config == resolved[0].config and pretrained.tokenizer_source == pretraining / "hf_export"
        assert all(torch.equal(tensor, resolved[0].encoder_state[name])
                   for name, tensor in pretrained.encoder_state.items())
    result = run("sst2", pretraining, tmp_path / "sst2", SAMPLE_SST2 / "train.tsv", None,
                 "data.limit_train_examples=16", "data.limit_eval_examples=16", "data.batch_size=8",
                 "trainer.max_epochs=1", "export.plot=false")
    assert result["global_step"] == 2
