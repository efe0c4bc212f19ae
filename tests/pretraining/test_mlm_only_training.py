"""Pre-training on MLM-only shards: the objective comes from the shard set's manifest (no NSP head, no NSP loss,
nothing set twice), and the export loads in transformers as BertForMaskedLM (equal MLM logits) and as BertModel."""
from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch

from pipeline.core.app import compose
from pipeline.core.checkpoints.weights import load_pretraining_model, load_pretraining_weights
from pipeline.pretraining.run import train


@pytest.fixture(scope="module")
def mlm_shards(tmp_path_factory, shared_data):
    inputs = tmp_path_factory.mktemp("books")
    shutil.copy(shared_data / "corpora" / "books" / "austen-persuasion.txt", inputs)
    out = tmp_path_factory.mktemp("shards") / "mlm"
    from data_prep.run import run
    run([f"inputs=[{{path: '{inputs}/*.txt', format: books}}]", f"output_dir={out}", "preset=phase1",
         "objective=mlm", "masking=dynamic", "dupe_factor=1", "num_shards=1", "masked_lm_prob=0.3",
         "max_predictions_per_seq=38", "--runner=DirectRunner", "--direct_running_mode=in_memory"])
    return out


@pytest.fixture(scope="module")
def mlm_run(mlm_shards, tmp_path_factory, tiny_overrides):
    out = tmp_path_factory.mktemp("run") / "out"
    result = train(compose("train", tiny_overrides(mlm_shards, out, 6, "data.max_predictions_per_seq=38",
                                                   "data.num_workers=2")))
    return result, out


def test_the_model_has_no_next_sentence_head_and_logs_no_nsp(mlm_run):
    result, out = mlm_run
    assert result["global_step"] == 6
    model = load_pretraining_model(out / "checkpoints" / "last.ckpt")
    assert model.nsp_head is None and model.bert.pooler is None
    with open(result["csv"], newline="") as handle:
        columns = set(next(csv.reader(handle)))
    assert {"train/mlm_loss", "train/mlm_acc"} <= columns
    assert not any("nsp" in column for column in columns)


def test_the_export_is_a_masked_lm_for_transformers_with_equal_logits(mlm_run):
    transformers = pytest.importorskip("transformers")
    _, out = mlm_run
    export = out / "hf_export"
    assert json.loads((export / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    masked_lm = transformers.BertForMaskedLM.from_pretrained(export, local_files_only=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(export, local_files_only=True)
    encoded = tokenizer("captain wentworth came into the room [SEP] anne was there", return_tensors="pt")
    ours = load_pretraining_model(out / "checkpoints" / "last.ckpt").eval()
    with torch.no_grad():
        theirs = masked_lm(**encoded).logits
        mine = ours(encoded["input_ids"], encoded["token_type_ids"], encoded["attention_mask"])
    assert mine.nsp_logits is None
    torch.testing.assert_close(theirs, mine.mlm_logits, rtol=1e-4, atol=1e-4)
    encoder = transformers.BertModel.from_pretrained(export, local_files_only=True, add_pooling_layer=False).eval()
    with torch.no_grad():
        states = encoder(**encoded).last_hidden_state
        torch.testing.assert_close(states, ours.bert(encoded["input_ids"], encoded["token_type_ids"],
                                                     encoded["attention_mask"]).sequence_output, rtol=1e-4, atol=1e-4)


def test_a_checkpoint_of_the_other_objective_is_refused_saying_why(mlm_run, small_shards):
    _, out = mlm_run
    from model import BertConfig, BertForPreTraining
    with pytest.raises(ValueError, match="objective mlm .MLM only."):
        load_pretraining_weights(BertForPreTraining(BertConfig.from_preset("tiny")), out / "checkpoints" / "last.ckpt")


def test_fine_tuning_starts_from_the_mlm_export(mlm_run):
    from model.bert.heads import BertForSequenceClassification
    from pipeline.core.checkpoints.weights import load_into_task_model, load_pretrained
    _, out = mlm_run
    pretrained = load_pretrained(out / "hf_export")
    model = BertForSequenceClassification(pretrained.config, num_labels=2)
    loaded = load_into_task_model(model, pretrained)
    assert loaded.startswith("encoder; pooler left at random initialisation")
