"""The four ModernBERT heads against transformers' ModernBertFor* classes with the same weights (fp32, eval), both
ways, with their losses; pooling by [CLS] and by the mean for the sequence-level ones."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from model.modernbert import (  # noqa: E402
    ModernBertForMultipleChoice,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
)
from model.modernbert.hf_conversion import (  # noqa: E402
    encoder_state_from_hf,
    load_task_from_hf_state_dict,
    task_to_hf_state_dict,
)
from model.shared.outputs import TaskOutput  # noqa: E402
from tests.model.modernbert_common import ATOL, CONFIG, hf_model, max_abs_diff, padded_batch  # noqa: E402

K = 3
# kind -> (our class, its extra arguments, transformers' class, its extra config)
KINDS = {
    "classification": (ModernBertForSequenceClassification, (4,), "ModernBertForSequenceClassification",
                       {"num_labels": 4}),
    "regression": (ModernBertForSequenceClassification, (1,), "ModernBertForSequenceClassification",
                   {"num_labels": 1, "problem_type": "regression"}),
    "multiple_choice": (ModernBertForMultipleChoice, (), "ModernBertForMultipleChoice", {}),
    "question_answering": (ModernBertForQuestionAnswering, (), "ModernBertForQuestionAnswering", {}),
    "token_classification": (ModernBertForTokenClassification, (5,), "ModernBertForTokenClassification",
                             {"num_labels": 5}),
}


def inputs_and_labels(kind: str) -> tuple[dict, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    if kind == "multiple_choice":
        batch = padded_batch(lengths=(48, 30, 20, 41, 9, 48), seed=4)
        inputs = {key: batch[key].view(2, K, -1) for key in ("input_ids", "attention_mask")}
        return inputs, torch.tensor([2, 0])
    # Question answering's loss is a softmax over all T positions, padding included, and the states of padding
    # far from any real token are not defined even in transformers (its sdpa and eager paths differ there by 4e-3):
    # its rows are unpadded here, test_question_answering_at_real_tokens pads them.
    batch = padded_batch(lengths=(48, 48, 48) if kind == "question_answering" else (48, 37, 19), seed=5)
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask")}
    B, T = batch["input_ids"].shape
    if kind == "classification":
        return inputs, torch.randint(0, 4, (B,), generator=generator)
    if kind == "regression":
        return inputs, torch.rand(B, generator=generator) * 5
    if kind == "question_answering":
        return inputs, torch.tensor([[3, 7], [10, 12], [1, 1]])
    labels = torch.randint(0, 5, (B, T), generator=generator).masked_fill(batch["attention_mask"] == 0, -100)
    return inputs, labels


def hf_logits_and_loss(kind: str, hf, inputs: dict, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        if kind == "question_answering":
            out = hf(**inputs, start_positions=labels[:, 0], end_positions=labels[:, 1])
            return torch.stack([out.start_logits, out.end_logits], dim=-1), out.loss
        out = hf(**inputs, labels=labels)
    return out.logits, out.loss


# The per-token heads do not pool: one pooling setting is enough for them.
CASES = [(kind, pooling) for kind in KINDS for pooling in ("cls", "mean")
         if pooling == "cls" or kind not in ("question_answering", "token_classification")]


@pytest.mark.parametrize("kind,pooling", CASES)
def test_head_equals_transformers(kind, pooling):
    ours_cls, args, hf_cls, hf_kwargs = KINDS[kind]
    config = dataclasses.replace(CONFIG, classifier_pooling=pooling)
    hf = hf_model(hf_cls, config, **hf_kwargs)
    assert hf.config.classifier_pooling == pooling
    torch.manual_seed(3)
    ours = ours_cls(config, *args).eval()
    assert isinstance(ours.encoder, ModernBertModel)
    inputs, labels = inputs_and_labels(kind)
    theirs, their_loss = hf_logits_and_loss(kind, hf, inputs, labels)

    # transformers -> ours
    load_task_from_hf_state_dict(ours, hf.state_dict())
    with torch.no_grad():
        mine = ours(**inputs, token_type_ids=torch.zeros_like(inputs["input_ids"]), labels=labels)
    assert isinstance(mine, TaskOutput)
    assert mine.logits.shape == theirs.shape
    if kind == "token_classification":
        real = inputs["attention_mask"].bool()
        diff = max_abs_diff(mine.logits[real], theirs[real])
    else:
        diff = max_abs_diff(mine.logits, theirs)
    loss_diff = abs(mine.loss.item() - their_loss.item())
    print(f"\n{kind}/{pooling}: max abs diff logits {diff:.2e}, loss {loss_diff:.2e}")
    assert diff <= ATOL and loss_diff <= ATOL

    # ours -> transformers, into a differently initialised model
    torch.manual_seed(11)
    fresh = ours_cls(config, *args).eval()
    hf_again = hf_model(hf_cls, config, seed=12, **hf_kwargs)
    hf_again.load_state_dict(task_to_hf_state_dict(fresh), strict=True)
    with torch.no_grad():
        mine = fresh(**inputs).logits
    theirs, _ = hf_logits_and_loss(kind, hf_again, inputs, labels)
    real = inputs["attention_mask"].bool() if kind == "token_classification" else slice(None)
    assert max_abs_diff(mine[real], theirs[real]) <= ATOL


def test_question_answering_at_real_tokens():
    hf = hf_model("ModernBertForQuestionAnswering")
    ours = ModernBertForQuestionAnswering(CONFIG).eval()
    load_task_from_hf_state_dict(ours, hf.state_dict())
    batch = padded_batch(seed=5)
    real = batch["attention_mask"].bool()
    theirs, _ = hf_logits_and_loss("question_answering", hf, {key: batch[key] for key in ("input_ids",
                                                                                           "attention_mask")},
                                   torch.tensor([[3, 7], [10, 12], [1, 1]]))
    with torch.no_grad():
        mine = ours(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert max_abs_diff(mine[real], theirs[real]) <= ATOL


def test_multiple_choice_cls_is_first_real_token_under_left_padding():
    """transformers' multiple choice pools [CLS] where attention_mask first is 1 (attention_mask.argmax)."""
    hf = hf_model("ModernBertForMultipleChoice")
    ours = ModernBertForMultipleChoice(CONFIG).eval()
    load_task_from_hf_state_dict(ours, hf.state_dict())
    batch = padded_batch(lengths=(48, 30, 20, 41, 9, 48), seed=4)
    left = {key: batch[key].flip(-1).view(2, K, -1) for key in ("input_ids", "attention_mask")}
    with torch.no_grad():
        assert max_abs_diff(ours(**left).logits, hf(**left).logits) <= ATOL


def test_losses_are_ours():
    """The BERT heads' losses: a token-classification batch without labels gives 0, not NaN."""
    ours = ModernBertForTokenClassification(CONFIG, 5)
    inputs, labels = inputs_and_labels("token_classification")
    assert ours(**inputs, labels=torch.full_like(labels, -100)).loss.item() == 0.0
    qa = ModernBertForQuestionAnswering(CONFIG).eval()
    with torch.no_grad():
        out = qa(**inputs_and_labels("question_answering")[0], labels=torch.tensor([[3, 7], [10, 12], [1, 1]]))
    expected = (F.cross_entropy(out.logits[..., 0], torch.tensor([3, 10, 1]))
                + F.cross_entropy(out.logits[..., 1], torch.tensor([7, 12, 1]))) / 2
    assert abs(out.loss.item() - expected.item()) <= 1e-6


def test_refuses_wrong_state_dicts():
    hf = hf_model("ModernBertForSequenceClassification", num_labels=4)
    with pytest.raises(ValueError, match="shapes differ"):
        load_task_from_hf_state_dict(ModernBertForSequenceClassification(CONFIG, 3), hf.state_dict())
    with pytest.raises(ValueError, match="missing"):
        load_task_from_hf_state_dict(ModernBertForTokenClassification(CONFIG, 4),
                                     {k: v for k, v in hf.state_dict().items() if k != "classifier.bias"})
    with pytest.raises(ValueError, match="num_labels must be a positive integer"):
        ModernBertForSequenceClassification(CONFIG, 0)


def test_the_encoder_is_split_from_a_transformers_state_dict_and_a_wrong_encoder_is_refused():
    state = hf_model("ModernBertForSequenceClassification", num_labels=2).state_dict()
    encoder, others = encoder_state_from_hf(state, CONFIG.num_layers)
    ModernBertModel(CONFIG).load_state_dict(encoder, strict=True)
    assert all(not name.startswith("model.") for name in others) and "classifier.weight" in others
    bare = {name.removeprefix("model."): tensor for name, tensor in state.items() if name.startswith("model.")}
    assert encoder_state_from_hf(bare, CONFIG.num_layers)[0].keys() == encoder.keys()   # a ModernBertModel's names
    with pytest.raises(ValueError, match="appears both with and without the 'model.' prefix"):
        encoder_state_from_hf({**state, **bare}, CONFIG.num_layers)
    with pytest.raises(ValueError, match=f"not a ModernBERT encoder with {CONFIG.num_layers + 1} layers: missing"):
        encoder_state_from_hf(state, CONFIG.num_layers + 1)
    with pytest.raises(ValueError, match=f"a {CONFIG.num_layers - 1}-layer ModernBERT does not have .more layers in "
                                         "the checkpoint"):
        encoder_state_from_hf(state, CONFIG.num_layers - 1)
