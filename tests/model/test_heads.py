"""The fine-tuning heads against transformers' BertForSequenceClassification and BertForMultipleChoice, and their
conversions: state dicts both ways, encoders out of any BERT checkpoint, exports, checkpoint directories."""
import json
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from model import BertConfig, BertForMultipleChoice, BertForPreTraining, BertForSequenceClassification, BertModel  # noqa: E402
from model.bert.hf_conversion import (  # noqa: E402
    config_from_hf,
    encoder_state_from_hf,
    hf_config_from,
    hf_task_config_dict,
    load_task_from_hf_state_dict,
    task_to_hf_state_dict,
    to_hf_state_dict,
)
from model.bert.hf_files import export_hf_task  # noqa: E402
from model.shared.hf_checkpoints import read_hf_checkpoint  # noqa: E402

VOCAB = 1000
ATOL = 1e-5
CONFIG = BertConfig.from_preset("tiny", vocab_size=VOCAB, hidden_size=64, max_position_embeddings=64)  # 2 layers
CHOICE_LENGTHS = (16, 11, 7, 9, 16, 5, 12, 8)  # B = 2 examples of K = 4 choices, padded to T = 16
K = 4

# kind of model -> num_labels of the sequence classifier (None: multiple choice)
KINDS = {"classification": 3, "regression": 1, "multiple_choice": None}


def our_model(kind: str, config: BertConfig = CONFIG, seed: int = 0):
    num_labels = KINDS[kind]
    torch.manual_seed(seed)
    if num_labels is not None:
        return BertForSequenceClassification(config, num_labels)
    return BertForMultipleChoice(config)


def hf_model(kind: str, config: BertConfig = CONFIG, attn_implementation: str = "sdpa", seed: int = 0):
    num_labels = KINDS[kind]
    torch.manual_seed(seed)
    if num_labels is not None:
        hf_config = hf_config_from(config, num_labels=num_labels, attn_implementation=attn_implementation)
        return transformers.BertForSequenceClassification(hf_config)
    return transformers.BertForMultipleChoice(hf_config_from(config, attn_implementation=attn_implementation))


def task_batch(kind: str, batch_factory, seed: int = 0) -> dict:
    """Inputs and labels for the kind of model, with padding: (B, T) and (B,), or (B, K, T) and (B,)."""
    generator = torch.Generator().manual_seed(seed + 100)
    if kind == "multiple_choice":
        batch = batch_factory(VOCAB, lengths=CHOICE_LENGTHS, seed=seed)
        inputs = {key: batch[key].view(-1, K, batch[key].shape[-1])
                  for key in ("input_ids", "token_type_ids", "attention_mask")}
        labels = torch.randint(0, K, (len(CHOICE_LENGTHS) // K,), generator=generator)
    else:
        batch = batch_factory(VOCAB, lengths=(16, 11, 7, 3), seed=seed)
        inputs = {key: batch[key] for key in ("input_ids", "token_type_ids", "attention_mask")}
        B = batch["input_ids"].shape[0]
        if kind == "regression":
            labels = torch.rand(B, generator=generator) * 5  # STS-B-like scores in [0, 5]
        else:
            labels = torch.randint(0, KINDS[kind], (B,), generator=generator)
    assert (inputs["attention_mask"] == 0).any() and (inputs["token_type_ids"] == 1).any()
    return {**inputs, "labels": labels}


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def assert_same_weights_dict(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    assert_same_weights_dict(a.state_dict(), b.state_dict())


def assert_same_outputs(ours, hf, batch: dict) -> None:
    with torch.no_grad():
        mine, theirs = ours(**batch), hf(**batch)
    assert mine.logits.shape == theirs.logits.shape
    diffs = (max_abs_diff(mine.logits, theirs.logits), abs(mine.loss.item() - theirs.loss.item()))
    assert max(diffs) <= ATOL, f"max abs diffs (logits, loss): {diffs}"


# ----------------------------------------------------------------------------------------------------------
# parity with transformers

@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_hf_to_ours_parity(kind, attn_implementation, batch_factory):
    """transformers' initialisation, loaded into ours: the same logits and loss."""
    hf = hf_model(kind, attn_implementation=attn_implementation).eval()
    ours = our_model(kind, seed=1).eval()
    load_task_from_hf_state_dict(ours, hf.state_dict())
    batch = task_batch(kind, batch_factory)
    assert_same_outputs(ours, hf, batch)
    if kind == "regression":
        assert hf.config.problem_type == "regression"  # inferred by transformers from num_labels == 1


@pytest.mark.parametrize("kind", list(KINDS))
def test_ours_to_hf_and_back(kind, batch_factory):
    ours = our_model(kind, seed=2).eval()
    hf_state = task_to_hf_state_dict(ours)
    hf = hf_model(kind, seed=3).eval()
    assert set(hf_state) == set(hf.state_dict())  # exactly transformers' names
    hf.load_state_dict(hf_state, strict=True)
    assert_same_outputs(ours, hf, task_batch(kind, batch_factory, seed=4))

    again = our_model(kind, seed=5)
    load_task_from_hf_state_dict(again, hf.state_dict())
    assert_same_weights(again, ours)  # bit for bit


def test_regression_loss_is_mse_of_the_single_output(batch_factory):
    model = our_model("regression").eval()
    batch = task_batch("regression", batch_factory)
    out = model(**batch)
    assert out.logits.shape == (4, 1)
    assert torch.allclose(out.loss, ((out.logits[:, 0] - batch["labels"]) ** 2).mean())
    # integer targets are fine: they are used as floats
    assert torch.allclose(model(**{**batch, "labels": batch["labels"].round().long()}).loss,
                          ((out.logits[:, 0] - batch["labels"].round()) ** 2).mean())


def test_multiple_choice_scores_each_choice_on_its_own(batch_factory):
    """A choice's score does not depend on the other choices (or on where it stands among them)."""
    model = our_model("multiple_choice").eval()
    batch = task_batch("multiple_choice", batch_factory)
    inputs = {key: batch[key] for key in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        logits = model(**inputs).logits  # (B, K)
        reversed_logits = model(**{key: value.flip(1) for key, value in inputs.items()}).logits
    assert logits.shape == (2, K)
    assert max_abs_diff(logits, reversed_logits.flip(1)) <= ATOL


def test_num_labels_must_be_positive():
    with pytest.raises(ValueError, match="num_labels"):
        BertForSequenceClassification(CONFIG, 0)


# ----------------------------------------------------------------------------------------------------------
# training mode

@pytest.mark.parametrize("kind", ["classification", "multiple_choice"])
def test_training_mode_dropout_and_gradients(kind, batch_factory):
    model = our_model(kind).train()
    batch = task_batch(kind, batch_factory)
    first, second = model(**batch), model(**batch)
    assert not torch.equal(first.logits, second.logits)  # dropout active (pooled output and encoder)
    first.loss.backward()
    for name in ("classifier.weight", "classifier.bias", "bert.pooler.dense.weight",
                 "bert.layers.0.attention.qkv.weight", "bert.embeddings.word_embeddings.weight"):
        grad = model.get_parameter(name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name

    model.eval()
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, model(**batch).logits)


# ----------------------------------------------------------------------------------------------------------
# encoder_state_from_hf

def test_encoder_from_a_bert_model_checkpoint(batch_factory):
    """transformers' BertModel: names without the "bert." prefix; our BertModel then gives its outputs."""
    hf = transformers.BertModel(hf_config_from(CONFIG)).eval()
    encoder, others = encoder_state_from_hf(hf.state_dict(), CONFIG.num_layers)
    assert others == {}
    ours = BertModel(CONFIG).eval()
    ours.load_state_dict(encoder, strict=True)
    batch = batch_factory(VOCAB)
    inputs = {key: batch[key] for key in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        theirs, mine = hf(**inputs), ours(**inputs)
    real = inputs["attention_mask"].bool()  # padded positions' states are never used
    assert max_abs_diff(mine.sequence_output[real], theirs.last_hidden_state[real]) <= ATOL
    assert max_abs_diff(mine.pooled_output, theirs.pooler_output) <= ATOL


def pretraining_names_in_old_style(state: dict) -> dict:
    """bert-base-uncased's pytorch_model.bin: LayerNorm gamma/beta, a position_ids buffer, no tied aliases."""
    old = {}
    for name, tensor in state.items():
        if name.startswith("cls.predictions.decoder"):
            continue
        if "LayerNorm" in name:
            name = name.replace(".weight", ".gamma").replace(".bias", ".beta")
        old[name] = tensor
    old["bert.embeddings.position_ids"] = torch.arange(CONFIG.max_position_embeddings)[None]
    return old


@pytest.mark.parametrize("old_names", [False, True], ids=["current", "gamma_beta"])
def test_encoder_from_a_pretraining_checkpoint(old_names):
    torch.manual_seed(0)
    pretrained = BertForPreTraining(CONFIG)
    state = to_hf_state_dict(pretrained)
    if old_names:
        state = pretraining_names_in_old_style(state)
    encoder, others = encoder_state_from_hf(state, CONFIG.num_layers)
    assert_same_weights_dict(encoder, pretrained.bert.state_dict())
    expected_others = {"cls.predictions.bias", "cls.predictions.transform.dense.weight",
                       "cls.predictions.transform.dense.bias", "cls.predictions.transform.LayerNorm.weight",
                       "cls.predictions.transform.LayerNorm.bias", "cls.seq_relationship.weight",
                       "cls.seq_relationship.bias"}
    if not old_names:
        expected_others |= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    assert set(others) == expected_others

    # the way fine-tuning starts: a fresh head on the pre-trained encoder
    model = BertForSequenceClassification(CONFIG, 2)
    model.bert.load_state_dict(encoder, strict=True)
    assert_same_weights(model.bert, pretrained.bert)


def test_encoder_without_a_pooler_and_bad_encoders():
    state = to_hf_state_dict(BertForPreTraining(CONFIG))
    no_pooler = {name: tensor for name, tensor in state.items() if not name.startswith("bert.pooler.")}
    encoder, _ = encoder_state_from_hf(no_pooler, CONFIG.num_layers)  # BertForMaskedLM has none
    assert not any(name.startswith("pooler.") for name in encoder)
    assert set(encoder) == set(BertModel(CONFIG).state_dict()) - {"pooler.dense.weight", "pooler.dense.bias"}

    key = "bert.encoder.layer.1.attention.self.key.weight"
    with pytest.raises(ValueError, match=r"missing 1 encoder tensors \['encoder.layer.1.attention.self.key.weight'\]"):
        encoder_state_from_hf({name: t for name, t in state.items() if name != key}, CONFIG.num_layers)
    with pytest.raises(ValueError, match="missing 16 encoder tensors"):  # asked for one layer too many
        encoder_state_from_hf(state, CONFIG.num_layers + 1)
    with pytest.raises(ValueError, match="more layers in the checkpoint"):
        encoder_state_from_hf(state, CONFIG.num_layers - 1)


def test_load_task_refuses_other_state_dicts():
    pretraining_state = to_hf_state_dict(BertForPreTraining(CONFIG))
    with pytest.raises(ValueError, match=r"missing \['classifier.bias', 'classifier.weight'\], unexpected \['cls"):
        load_task_from_hf_state_dict(our_model("classification"), pretraining_state)
    three_labels = task_to_hf_state_dict(our_model("classification"))
    with pytest.raises(ValueError, match=r"shapes differ .*classifier.weight \(3, 64\) vs the model's \(1, 64\)"):
        load_task_from_hf_state_dict(our_model("regression"), three_labels)
    with pytest.raises(TypeError, match="BertForPreTraining"):
        task_to_hf_state_dict(BertForPreTraining(CONFIG))


# ----------------------------------------------------------------------------------------------------------
# configs, exports, checkpoint directories

def test_config_from_a_fine_tuned_models_config():
    """transformers writes tie_word_embeddings true even for a classifier; others write false or nothing."""
    for kind in ("classification", "multiple_choice"):
        values = hf_task_config_dict(our_model(kind))
        assert config_from_hf(values) == CONFIG
        assert config_from_hf({**values, "tie_word_embeddings": False}) == CONFIG
        assert config_from_hf({k: v for k, v in values.items() if k != "tie_word_embeddings"}) == CONFIG
    assert config_from_hf(hf_model("classification").config) == CONFIG
    pretraining = {**hf_task_config_dict(our_model("classification")), "architectures": ["BertForPreTraining"]}
    with pytest.raises(ValueError, match="tie_word_embeddings=False"):
        config_from_hf({**pretraining, "tie_word_embeddings": False})


def test_task_config_labels():
    regression = hf_task_config_dict(our_model("regression"))
    assert (regression["architectures"], regression["problem_type"]) == (["BertForSequenceClassification"],
                                                                         "regression")
    assert (regression["num_labels"], regression["id2label"]) == (1, {"0": "LABEL_0"})
    named = hf_task_config_dict(our_model("classification"), id2label={2: "c", 0: "a", 1: "b"})
    assert named["id2label"] == {"0": "a", "1": "b", "2": "c"} and named["label2id"] == {"a": 0, "b": 1, "c": 2}
    assert named["problem_type"] == "single_label_classification"
    assert hf_task_config_dict(our_model("classification"), id2label=("a", "b", "c")) == named
    choice = hf_task_config_dict(our_model("multiple_choice"))
    assert choice["architectures"] == ["BertForMultipleChoice"] and "id2label" not in choice
    with pytest.raises(ValueError, match="2 label names for 3 labels"):
        hf_task_config_dict(our_model("classification"), id2label=["a", "b"])
    with pytest.raises(ValueError, match="distinct"):
        hf_task_config_dict(our_model("classification"), id2label=["a", "b", "a"])


SPECIALS = ["[PAD]", "[unused0]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]


def test_export_sequence_classifier_loads_offline(tmp_path, batch_factory):
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    ours = our_model("classification").eval()
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("".join(token + "\n" for token in SPECIALS + [f"w{i}" for i in range(994)]),
                          encoding="utf-8")
    out_dir = export_hf_task(ours, tmp_path / "export", vocab_file, id2label=("contradiction", "entailment", "neutral"))

    hf, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        out_dir, output_loading_info=True, local_files_only=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(hf).__name__ == "BertForSequenceClassification"
    assert hf.config.id2label == {0: "contradiction", 1: "entailment", 2: "neutral"}
    assert hf.config.label2id == {"contradiction": 0, "entailment": 1, "neutral": 2}
    assert hf.config.problem_type == "single_label_classification"
    assert_same_outputs(ours, hf.eval(), task_batch("classification", batch_factory, seed=6))
    tokenizer = transformers.AutoTokenizer.from_pretrained(out_dir, local_files_only=True)
    assert tokenizer("w3")["input_ids"] == [2, 9, 3]

    config, state = read_hf_checkpoint(out_dir)
    assert config == json.loads((out_dir / "config.json").read_text())
    assert config_from_hf(config) == CONFIG
    again = BertForSequenceClassification(config_from_hf(config), config["num_labels"])
    load_task_from_hf_state_dict(again, state)
    assert_same_weights(again, ours)


@pytest.mark.parametrize("kind", ["regression", "multiple_choice"])
def test_export_regressor_and_multiple_choice_load_offline(kind, tmp_path, batch_factory):
    ours = our_model(kind).eval()
    out_dir = export_hf_task(ours, tmp_path / "export")
    auto = (transformers.AutoModelForMultipleChoice if kind == "multiple_choice"
            else transformers.AutoModelForSequenceClassification)
    hf, info = auto.from_pretrained(out_dir, output_loading_info=True, local_files_only=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(hf).__name__ == type(ours).__name__
    if kind == "regression":
        assert (hf.config.num_labels, hf.config.problem_type) == (1, "regression")
    assert_same_outputs(ours, hf.eval(), task_batch(kind, batch_factory, seed=7))


def test_read_hf_checkpoint_formats(tmp_path):
    hf = hf_model("classification")
    expected = dict(hf.state_dict())

    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="200KB")
    assert (sharded / "model.safetensors.index.json").is_file() and not (sharded / "model.safetensors").exists()
    config, state = read_hf_checkpoint(sharded)
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert_same_weights_dict(state, expected)

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((sharded / "config.json").read_text())
    torch.save(expected, pickled / "pytorch_model.bin")
    _, state = read_hf_checkpoint(pickled)
    assert_same_weights_dict(state, expected)

    (pickled / "pytorch_model.bin").unlink()
    with pytest.raises(FileNotFoundError, match="no PyTorch weights"):
        read_hf_checkpoint(pickled)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        read_hf_checkpoint(tmp_path / "nowhere")
