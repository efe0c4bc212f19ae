"""`init=`: every kind of checkpoint a user has resolves to the same encoder, with its tokenizer, or a clear error."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from model import BertConfig, BertForPreTraining, BertForSequenceClassification  # noqa: E402
from model.bert.hf_files import export_hf  # noqa: E402
from pipeline.core.checkpoints.weights import load_into_task_model, load_pretrained  # noqa: E402
from pipeline.finetuning.tokenizer import load_tokenizer  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
VOCAB = REPO_ROOT / "data_prep" / "vocab" / "bert-base-uncased-vocab.txt"
CASED_VOCAB = REPO_ROOT / "data_prep" / "vocab" / "bert-base-cased-vocab.txt"


@pytest.fixture(scope="module")
def pretraining_run(small_shards, tmp_path_factory, tiny_overrides):
    from pipeline.core.app import compose
    from pipeline.pretraining.run import train

    out = tmp_path_factory.mktemp("pretrain") / "run"
    train(compose("train", tiny_overrides(small_shards, out, 4)))
    return out


def encoder_of(model_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k.removeprefix("model.bert."): v for k, v in model_state.items() if k.startswith("model.bert.")}


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_run_dir_ckpt_and_hf_export_give_the_same_encoder_and_tokenizer(pretraining_run):
    checkpoint = torch.load(pretraining_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    expected = encoder_of(checkpoint["state_dict"])
    for init in (pretraining_run, pretraining_run / "checkpoints" / "last.ckpt", pretraining_run / "hf_export"):
        pretrained = load_pretrained(init)
        assert pretrained.config == BertConfig(**checkpoint["hyper_parameters"]["model_config"]), init
        assert_same_tensors(pretrained.encoder_state, expected)
        assert pretrained.tokenizer_source == pretraining_run / "hf_export"
        assert pretrained.has_pooler


@pytest.mark.slow
def test_a_deepspeed_checkpoint_directory_gives_the_consolidated_weights(small_shards, tmp_path, tiny_overrides,
                                                                        training_process, torch_extensions_dir,
                                                                        monkeypatch):
    """A ZeRO-2 run on the CPU (DeepSpeed over gloo) leaves checkpoints/last.ckpt as a DeepSpeed directory."""
    pytest.importorskip("deepspeed")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", torch_extensions_dir)
    out = tmp_path / "run"
    proc = training_process(tiny_overrides(small_shards, out, 3, "strategy=deepspeed_stage_2"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    checkpoint = out / "checkpoints" / "last.ckpt"
    assert checkpoint.is_dir()
    pretrained = load_pretrained(checkpoint)
    consolidated = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))
    assert_same_tensors(pretrained.encoder_state, encoder_of(consolidated))
    assert pretrained.config == BertConfig.from_preset("tiny", vocab_size=30522, max_position_embeddings=512)
    assert pretrained.tokenizer_source == out / "hf_export"


def test_a_bert_model_checkpoint_without_prefix_or_pooler_loads_with_a_random_pooler(tmp_path):
    transformers = pytest.importorskip("transformers")
    from model.bert.hf_conversion import hf_config_from

    config = BertConfig.from_preset("tiny", vocab_size=30522)
    torch.manual_seed(0)
    hf = transformers.BertModel(hf_config_from(config), add_pooling_layer=False)
    hf.save_pretrained(tmp_path / "bert")
    (tmp_path / "bert" / "vocab.txt").write_text(VOCAB.read_text())
    pretrained = load_pretrained(tmp_path / "bert")
    assert not pretrained.has_pooler
    model = BertForSequenceClassification(pretrained.config, num_labels=2)
    report = load_into_task_model(model, pretrained)
    assert "pooler left at random initialisation" in report and "new task head" in report
    torch.testing.assert_close(model.bert.embeddings.word_embeddings.weight, hf.embeddings.word_embeddings.weight,
                               rtol=0, atol=0)


def test_a_fine_tuned_head_of_the_same_shape_is_loaded(tmp_path):
    from model.bert.hf_files import export_hf_task

    config = BertConfig.from_preset("tiny", vocab_size=30522)
    trained = BertForSequenceClassification(config, num_labels=3)
    export_hf_task(trained, tmp_path / "mnli", VOCAB, id2label={0: "entailment", 1: "neutral", 2: "contradiction"})
    pretrained = load_pretrained(tmp_path / "mnli")
    same_shape = BertForSequenceClassification(config, num_labels=3)
    assert "task head (classifier.bias, classifier.weight)" in load_into_task_model(same_shape, pretrained)
    assert torch.equal(same_shape.classifier.weight, trained.classifier.weight)
    other_shape = BertForSequenceClassification(config, num_labels=2)
    assert "new task head" in load_into_task_model(other_shape, pretrained)


def test_a_vocabulary_larger_than_the_embedding_is_refused(tmp_path):
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=28996))
    export_hf(model, tmp_path / "cased", CASED_VOCAB)
    pretrained = load_pretrained(tmp_path / "cased", tokenizer=VOCAB)
    with pytest.raises(ValueError, match="30522 tokens but the model's embedding only 28996 rows"):
        load_tokenizer(pretrained.tokenizer_source, pretrained.config.vocab_size)


def test_lowercasing_follows_tokenizer_config(tmp_path):
    (tmp_path / "vocab.txt").write_text(CASED_VOCAB.read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    cased = load_tokenizer(tmp_path, 28996)
    assert not cased.lowercase
    assert cased.encode(["Paris"]) != load_tokenizer(CASED_VOCAB, 28996).encode(["Paris"])


@pytest.mark.parametrize("setup, error, message", [
    ("missing", FileNotFoundError, "does not exist"),
    ("empty_dir", ValueError, "holds no weights this pipeline knows"),
    ("foreign_file", ValueError, "not a Lightning checkpoint of this pipeline"),
])
def test_bad_init_is_refused_with_a_message(tmp_path, setup, error, message):
    path = tmp_path / "init"
    if setup == "empty_dir":
        path.mkdir()
    elif setup == "foreign_file":
        torch.save({"weight": torch.zeros(2)}, path)
    with pytest.raises(error, match=message):
        load_pretrained(path)


def test_no_tokenizer_anywhere_asks_for_one(tmp_path):
    export_hf(BertForPreTraining(BertConfig.from_preset("tiny")), tmp_path / "weights_only")
    pretrained = load_pretrained(tmp_path / "weights_only")
    with pytest.raises(ValueError, match="pass tokenizer="):
        load_tokenizer(pretrained.tokenizer_source, pretrained.config.vocab_size)
