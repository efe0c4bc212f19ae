"""The per-token heads against transformers' BertForQuestionAnswering and BertForTokenClassification, and their
conversions: state dicts both ways, configs, exports that AutoModelFor* load offline, transformers' own saves."""
import json
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from model import BertConfig, BertForPreTraining, BertForQuestionAnswering, BertForTokenClassification  # noqa: E402
from model.bert.hf_conversion import (  # noqa: E402
    config_from_hf,
    hf_config_from,
    hf_task_config_dict,
    load_task_from_hf_state_dict,
    task_to_hf_state_dict,
    to_hf_state_dict,
)
from model.bert.hf_files import export_hf_task  # noqa: E402
from model.shared.hf_checkpoints import read_hf_checkpoint  # noqa: E402
from model.shared.losses import span_loss  # noqa: E402

VOCAB = 1000
ATOL = 1e-5
CONFIG = BertConfig.from_preset("tiny", vocab_size=VOCAB, hidden_size=64, max_position_embeddings=64)  # 2 layers
LENGTHS = (16, 11, 7, 3)  # B = 4, padded to T = 16
B, T = len(LENGTHS), max(LENGTHS)
NER_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")

# kind of model -> num_labels of the token classifier (None: question answering)
KINDS = {"question_answering": None, "token_classification": len(NER_TAGS)}
POOLER = {"bert.pooler.dense.weight", "bert.pooler.dense.bias"}


def our_model(kind: str, config: BertConfig = CONFIG, seed: int = 0):
    torch.manual_seed(seed)
    if kind == "question_answering":
        return BertForQuestionAnswering(config)
    return BertForTokenClassification(config, KINDS[kind])


def hf_model(kind: str, config: BertConfig = CONFIG, attn_implementation: str = "sdpa", seed: int = 0):
    torch.manual_seed(seed)
    if kind == "question_answering":
        return transformers.BertForQuestionAnswering(hf_config_from(config, attn_implementation=attn_implementation))
    hf_config = hf_config_from(config, num_labels=KINDS[kind], attn_implementation=attn_implementation)
    return transformers.BertForTokenClassification(hf_config)


def task_batch(kind: str, batch_factory, seed: int = 0) -> dict:
    """Padded (B, T) inputs, and labels: (B, 2) answer positions inside each row, or (B, T) tags with -100 at
    [CLS], padding and some (later sub-token) positions."""
    batch = batch_factory(VOCAB, lengths=LENGTHS, seed=seed)
    inputs = {key: batch[key] for key in ("input_ids", "token_type_ids", "attention_mask")}
    assert (inputs["attention_mask"] == 0).any() and (inputs["token_type_ids"] == 1).any()
    generator = torch.Generator().manual_seed(seed + 100)
    if kind == "question_answering":
        starts = torch.tensor([int(torch.randint(1, n, (1,), generator=generator)) for n in LENGTHS])
        ends = torch.minimum(starts + torch.randint(0, 4, (B,), generator=generator), torch.tensor(LENGTHS) - 1)
        labels = torch.stack([starts, ends], dim=1)  # (B, 2)
    else:
        labels = torch.randint(0, KINDS[kind], (B, T), generator=generator)
        labels[inputs["attention_mask"] == 0] = -100
        labels[:, 0] = -100
        labels[torch.rand(B, T, generator=generator) < 0.3] = -100
    return {**inputs, "labels": labels}


def hf_outputs(hf, batch: dict):
    """transformers' (logits in our layout, loss) for our batch: QA takes the positions as two tensors and returns
    two logits tensors, which ours stacks as (B, T, 2)."""
    inputs = {key: batch[key] for key in ("input_ids", "token_type_ids", "attention_mask")}
    if isinstance(hf, transformers.BertForQuestionAnswering):
        out = hf(**inputs, start_positions=batch["labels"][:, 0], end_positions=batch["labels"][:, 1])
        return torch.stack([out.start_logits, out.end_logits], dim=-1), out.loss
    out = hf(**inputs, labels=batch["labels"])
    return out.logits, out.loss


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    a, b = a.state_dict(), b.state_dict()
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name


def assert_same_outputs(ours, hf, batch: dict) -> None:
    """Logits at every position (padding included: the QA softmax runs over all T) and the loss."""
    with torch.no_grad():
        mine = ours(**batch)
        logits, loss = hf_outputs(hf, batch)
    assert mine.logits.shape == logits.shape
    diffs = (max_abs_diff(mine.logits, logits), abs(mine.loss.item() - loss.item()))
    assert max(diffs) <= ATOL, f"max abs diffs (logits, loss): {diffs}"


# ----------------------------------------------------------------------------------------------------------
# parity with transformers

@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_hf_to_ours_parity(kind, attn_implementation, batch_factory):
    """transformers' initialisation, loaded into ours: the same logits and loss on a padded batch."""
    hf = hf_model(kind, attn_implementation=attn_implementation).eval()
    ours = our_model(kind, seed=1).eval()
    load_task_from_hf_state_dict(ours, hf.state_dict())
    assert_same_outputs(ours, hf, task_batch(kind, batch_factory))


@pytest.mark.parametrize("kind", list(KINDS))
def test_ours_to_hf_and_back(kind, batch_factory):
    ours = our_model(kind, seed=2).eval()
    hf_state = task_to_hf_state_dict(ours)
    hf = hf_model(kind, seed=3).eval()
    assert set(hf_state) == set(hf.state_dict())  # exactly transformers' names: no pooler, as theirs
    assert not POOLER & set(hf_state)
    hf.load_state_dict(hf_state, strict=True)
    assert_same_outputs(ours, hf, task_batch(kind, batch_factory, seed=4))

    again = our_model(kind, seed=5)
    load_task_from_hf_state_dict(again, hf.state_dict())
    assert_same_weights(again, ours)  # bit for bit


@pytest.mark.parametrize("kind", list(KINDS))
def test_transformers_own_checkpoint_loads(kind, tmp_path, batch_factory):
    """A directory written by transformers' save_pretrained -> read_hf_checkpoint -> our model: same outputs."""
    hf = hf_model(kind, seed=6).eval()
    hf.save_pretrained(tmp_path / "saved")
    config, state = read_hf_checkpoint(tmp_path / "saved")
    assert config["architectures"] == [type(hf).__name__] and config_from_hf(config) == CONFIG
    ours = our_model(kind, config_from_hf(config), seed=7).eval()
    load_task_from_hf_state_dict(ours, state)
    assert_same_outputs(ours, hf, task_batch(kind, batch_factory, seed=8))


# ----------------------------------------------------------------------------------------------------------
# question answering: positions outside the sequence

def test_span_positions_outside_the_sequence(batch_factory):
    """transformers clamps positions to [0, T] and ignores T: beyond the sequence takes no part, negative counts as
    [CLS]. Start and end are averaged separately: a row whose end alone is beyond still trains its start."""
    hf = hf_model("question_answering").eval()
    ours = our_model("question_answering", seed=1).eval()
    load_task_from_hf_state_dict(ours, hf.state_dict())
    batch = task_batch("question_answering", batch_factory, seed=9)
    labels = torch.tensor([[T, T], [3, T + 40], [-2, 5], [1, 2]])  # beyond (exactly T), end beyond, negative, inside
    batch = {**batch, "labels": labels}
    assert_same_outputs(ours, hf, batch)

    with torch.no_grad():
        logits = ours(**batch).logits  # (B, T, 2)
    log_probs = logits.log_softmax(dim=1)  # over the T positions
    start = -(log_probs[1, 3, 0] + log_probs[2, 0, 0] + log_probs[3, 1, 0]) / 3  # rows 1-3; -2 -> 0
    end = -(log_probs[2, 5, 1] + log_probs[3, 2, 1]) / 2  # rows 2-3
    assert abs(ours(**batch).loss.item() - ((start + end) / 2).item()) <= ATOL


def test_span_loss_with_every_position_outside_is_zero_not_nan():
    """transformers' mean over no positions is NaN (0/0); ours is 0 with zero gradients, so a training run survives
    a batch whose answers all lie beyond its windows."""
    logits = torch.randn(2, 5, 2, requires_grad=True)
    labels = torch.tensor([[5, 9], [7, 5]])
    loss = span_loss(logits, labels)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))
    assert torch.isnan(torch.nn.functional.cross_entropy(logits[..., 0], labels[:, 0].clamp(0, 5), ignore_index=5))


def test_span_labels_must_be_start_and_end_per_row(batch_factory):
    model = our_model("question_answering").eval()
    batch = task_batch("question_answering", batch_factory)
    with pytest.raises(ValueError, match=r"span labels must be \(B, 2\) = \(4, 2\) .* got \(2, 4\)"):
        model(**{**batch, "labels": batch["labels"].T})


# ----------------------------------------------------------------------------------------------------------
# token classification: ignored positions

def test_token_loss_is_the_mean_over_labelled_tokens(batch_factory):
    model = our_model("token_classification").eval()
    batch = task_batch("token_classification", batch_factory)
    with torch.no_grad():
        out = model(**batch)
    labelled = batch["labels"] != -100  # (B, T)
    picked = out.logits.log_softmax(dim=-1)[labelled].gather(1, batch["labels"][labelled][:, None])
    assert out.logits.shape == (B, T, len(NER_TAGS))
    assert abs(out.loss.item() + picked.mean().item()) <= ATOL
    none = model(**{**batch, "labels": torch.full((B, T), -100)}).loss
    assert none.item() == 0.0  # transformers: NaN


def test_num_labels_must_be_positive():
    with pytest.raises(ValueError, match="num_labels must be a positive integer, got 0"):
        BertForTokenClassification(CONFIG, 0)


# ----------------------------------------------------------------------------------------------------------
# no pooler; training mode

@pytest.mark.parametrize("kind", list(KINDS))
def test_training_mode_every_parameter_gets_a_gradient(kind, batch_factory):
    """No pooler (nothing would reach it: DDP with find_unused_parameters=False refuses such parameters); dropout
    active in training (QA: in the encoder only), none in evaluation."""
    model = our_model(kind).train()
    assert model.bert.pooler is None and not any(name.startswith("bert.pooler.") for name in model.state_dict())
    batch = task_batch(kind, batch_factory)
    first, second = model(**batch), model(**batch)
    assert first.logits.shape[:2] == (B, T)
    assert not torch.equal(first.logits, second.logits)
    first.loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all() and param.grad.abs().sum() > 0, name

    model.eval()
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, model(**batch).logits)


@pytest.mark.parametrize("kind", list(KINDS))
def test_head_dropout_only_for_token_classification(kind, batch_factory):
    """With the encoder's dropouts off, training-mode logits vary only through the head's dropout: token
    classification has one on the sequence output, question answering none (as transformers)."""
    model = our_model(kind)
    for module in model.bert.modules():  # the encoder's dropouts read dropout_p
        if hasattr(module, "dropout_p"):
            module.dropout_p = 0.0
    model.train()
    batch = task_batch(kind, batch_factory)
    deterministic = torch.equal(model(**batch).logits, model(**batch).logits)
    assert deterministic == (kind == "question_answering")
    if kind == "token_classification":
        model.dropout_p = 0.0
        assert torch.equal(model(**batch).logits, model(**batch).logits)


# ----------------------------------------------------------------------------------------------------------
# state dicts refused or tolerated

@pytest.mark.parametrize("kind", list(KINDS))
def test_an_old_checkpoints_pooler_is_dropped(kind, batch_factory):
    """Checkpoints saved before transformers left the pooler out of these classes carry one: unused, dropped."""
    hf = hf_model(kind).eval()
    old = dict(hf.state_dict())
    C = CONFIG.hidden_size
    old.update({"bert.pooler.dense.weight": torch.randn(C, C), "bert.pooler.dense.bias": torch.randn(C)})
    ours = our_model(kind, seed=1).eval()
    load_task_from_hf_state_dict(ours, old)
    assert_same_outputs(ours, hf, task_batch(kind, batch_factory))


def test_load_refuses_other_state_dicts():
    qa_state = task_to_hf_state_dict(our_model("question_answering"))
    with pytest.raises(ValueError, match=r"missing \['classifier.bias', 'classifier.weight'\], "
                                         r"unexpected \['qa_outputs.bias', 'qa_outputs.weight'\]"):
        load_task_from_hf_state_dict(our_model("token_classification"), qa_state)
    with pytest.raises(ValueError, match=r"missing \['qa_outputs.bias', 'qa_outputs.weight'\], unexpected \['cls"):
        load_task_from_hf_state_dict(our_model("question_answering"), to_hf_state_dict(BertForPreTraining(CONFIG)))
    three_tags = task_to_hf_state_dict(BertForTokenClassification(CONFIG, 3))
    with pytest.raises(ValueError, match=r"shapes differ .*classifier.weight \(3, 64\) vs the model's \(9, 64\)"):
        load_task_from_hf_state_dict(our_model("token_classification"), three_tags)


# ----------------------------------------------------------------------------------------------------------
# configs and exports

def test_task_configs():
    qa = hf_task_config_dict(our_model("question_answering"))
    assert qa["architectures"] == ["BertForQuestionAnswering"]
    assert not {"num_labels", "id2label", "label2id", "problem_type"} & set(qa)  # transformers' default: 2 outputs
    with pytest.raises(ValueError, match="question-answering model has no labels"):
        hf_task_config_dict(our_model("question_answering"), id2label=["start", "end"])

    ner = hf_task_config_dict(our_model("token_classification"), id2label=NER_TAGS)
    assert ner["architectures"] == ["BertForTokenClassification"] and "problem_type" not in ner
    assert ner["num_labels"] == 9 and ner["id2label"] == {str(i): tag for i, tag in enumerate(NER_TAGS)}
    assert ner["label2id"] == {tag: i for i, tag in enumerate(NER_TAGS)}
    default = hf_task_config_dict(our_model("token_classification"))
    assert default["id2label"] == {str(i): f"LABEL_{i}" for i in range(9)}
    with pytest.raises(ValueError, match="3 label names for 9 labels"):
        hf_task_config_dict(our_model("token_classification"), id2label=NER_TAGS[:3])
    for values in (qa, ner):
        assert config_from_hf(values) == CONFIG


SPECIALS = ["[PAD]", "[unused0]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]


def test_export_question_answering_loads_offline(tmp_path, batch_factory):
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    ours = our_model("question_answering").eval()
    out_dir = export_hf_task(ours, tmp_path / "export")
    hf, info = transformers.AutoModelForQuestionAnswering.from_pretrained(
        out_dir, output_loading_info=True, local_files_only=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(hf).__name__ == "BertForQuestionAnswering" and hf.config.num_labels == 2
    assert_same_outputs(ours, hf.eval(), task_batch("question_answering", batch_factory, seed=10))

    config, state = read_hf_checkpoint(out_dir)
    again = BertForQuestionAnswering(config_from_hf(config))
    load_task_from_hf_state_dict(again, state)
    assert_same_weights(again, ours)


def test_export_token_classifier_loads_offline(tmp_path, batch_factory):
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    ours = our_model("token_classification").eval()
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("".join(token + "\n" for token in SPECIALS + [f"w{i}" for i in range(994)]),
                          encoding="utf-8")
    out_dir = export_hf_task(ours, tmp_path / "export", vocab_file, id2label=dict(enumerate(NER_TAGS)))

    hf, info = transformers.AutoModelForTokenClassification.from_pretrained(
        out_dir, output_loading_info=True, local_files_only=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(hf).__name__ == "BertForTokenClassification"
    assert hf.config.id2label == dict(enumerate(NER_TAGS))
    assert hf.config.label2id == {tag: i for i, tag in enumerate(NER_TAGS)}
    assert_same_outputs(ours, hf.eval(), task_batch("token_classification", batch_factory, seed=11))
    tokenizer = transformers.AutoTokenizer.from_pretrained(out_dir, local_files_only=True)
    assert tokenizer("w3")["input_ids"] == [2, 9, 3]

    config, state = read_hf_checkpoint(out_dir)
    assert config == json.loads((out_dir / "config.json").read_text())
    again = BertForTokenClassification(config_from_hf(config), config["num_labels"])
    load_task_from_hf_state_dict(again, state)
    assert_same_weights(again, ours)
