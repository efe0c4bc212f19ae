"""Unpadding (model/shared/unpadding.py): the same weights and batch through the padded and the unpadded encoder.

fp32 on the CPU. Without dropout the two compute the same function, so they agree up to float rounding (other row
counts, other matmul blockings). With dropout the unpadded encoder draws its hidden-state masks over (N, C), not
(B, T, C): other masks of the same rate, so only attention dropout (drawn over (B, nh, T, T) by both) is compared.
"""
import pytest
import torch

from model import BertConfig, BertForPreTraining
from tests.model.conftest import CLS_ID, PAD_ID, SEP_ID

VOCAB = 1000
LOSSES = ("loss", "mlm_loss", "nsp_loss")


def mini_model(**dropout) -> BertForPreTraining:
    torch.manual_seed(0)
    config = BertConfig.from_preset("mini", vocab_size=VOCAB, **{"hidden_dropout": 0.0, "attention_dropout": 0.0,
                                                                  **dropout})
    return BertForPreTraining(config)


def pretraining_inputs(batch: dict) -> dict:
    return {key: batch[key] for key in ("input_ids", "token_type_ids", "attention_mask", "masked_positions",
                                        "masked_lm_labels", "next_sentence_labels")}


def token_index(attention_mask: torch.Tensor, multiple: int = 1) -> torch.Tensor:
    """The collator's rule (pipeline/pretraining/data/collator.py), in torch: the real tokens' flat indices, then the
    first padding positions up to a multiple of `multiple`."""
    flat = attention_mask.flatten().bool()
    real, padding = flat.nonzero().squeeze(1), (~flat).nonzero().squeeze(1)
    size = min(-(-len(real) // multiple) * multiple, flat.numel())
    return torch.cat([real, padding[:size - len(real)]])


def run(model: BertForPreTraining, inputs: dict, index: torch.Tensor | None, seed: int = 1):
    """Losses and the gradient of every parameter (name -> tensor) of one forward and backward."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(**inputs, token_index=index)
    out.loss.backward()
    return out, {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_same_step(model: BertForPreTraining, inputs: dict, index: torch.Tensor) -> None:
    padded, padded_grads = run(model, inputs, None)
    unpadded, unpadded_grads = run(model, inputs, index)
    for name in LOSSES:
        torch.testing.assert_close(getattr(unpadded, name), getattr(padded, name), rtol=1e-5, atol=0)
    assert unpadded.mlm_correct == padded.mlm_correct and unpadded.mlm_total == padded.mlm_total
    assert unpadded_grads.keys() == padded_grads.keys()
    for name, grad in padded_grads.items():
        torch.testing.assert_close(unpadded_grads[name], grad, rtol=1e-4, atol=1e-7, msg=name)


def assert_same_states(model: BertForPreTraining, inputs: dict, index: torch.Tensor) -> None:
    """sequence_output and every hidden state equal at the computed tokens, zeros elsewhere."""
    encoder_inputs = (inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"])
    with torch.no_grad():
        padded = model.bert(*encoder_inputs, output_hidden_states=True)
        unpadded = model.bert(*encoder_inputs, output_hidden_states=True, token_index=index)
    B, T = inputs["input_ids"].shape
    computed = torch.zeros(B * T, dtype=torch.bool)
    computed[index] = True
    computed = computed.view(B, T)
    real = inputs["attention_mask"].bool() if inputs["attention_mask"] is not None else torch.ones(B, T).bool()
    assert (computed >= real).all()
    states = list(zip((padded.sequence_output, *padded.hidden_states[1:]),
                      (unpadded.sequence_output, *unpadded.hidden_states[1:])))
    for expected, actual in states:
        assert actual.shape == expected.shape == (B, T, model.config.hidden_size)
        torch.testing.assert_close(actual[computed], expected[computed], rtol=1e-5, atol=1e-5)
        assert (actual[~computed] == 0).all()
    torch.testing.assert_close(unpadded.hidden_states[0], padded.hidden_states[0], rtol=0, atol=0)  # embeddings
    torch.testing.assert_close(unpadded.pooled_output, padded.pooled_output, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("multiple", [1, 8, 200], ids=["real-tokens", "rounded-to-8", "all-positions"])
def test_without_dropout_the_unpadded_encoder_gives_the_padded_losses_states_and_gradients(batch_factory, multiple):
    """multiple=8 adds padding positions as the collator does to round N up; 200 > B * T = 160 takes them all."""
    model = mini_model().eval()
    inputs = pretraining_inputs(batch_factory(VOCAB, lengths=(40, 33, 17, 5), max_predictions=6))
    index = token_index(inputs["attention_mask"], multiple)
    assert len(index) == {1: 95, 8: 96, 200: 160}[multiple]
    assert_same_states(model, inputs, index)
    assert_same_step(model, inputs, index)


def test_a_batch_without_padding(batch_factory):
    """Every position is a token: the unpadded encoder takes them all, with a mask or without one."""
    model = mini_model().eval()
    inputs = pretraining_inputs(batch_factory(VOCAB, lengths=(24, 24, 24), max_predictions=5))
    assert inputs["attention_mask"].all()
    index = token_index(inputs["attention_mask"], 8)
    assert torch.equal(index, torch.arange(72))
    assert_same_states(model, inputs, index)
    assert_same_step(model, inputs, index)
    assert_same_step(model, {**inputs, "attention_mask": None}, index)


def test_a_row_of_cls_and_sep_only():
    """The shortest row there is: 2 tokens, nothing to predict in it (its MLM slots are all padding)."""
    model = mini_model().eval()
    generator = torch.Generator().manual_seed(3)
    lengths, T, P = (12, 2, 9), 12, 3
    attention_mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    input_ids = torch.randint(5, VOCAB, (3, T), generator=generator).masked_fill(attention_mask == 0, PAD_ID)
    input_ids[:, 0] = CLS_ID
    input_ids[torch.arange(3), torch.tensor(lengths) - 1] = SEP_ID
    inputs = {"input_ids": input_ids, "token_type_ids": torch.zeros_like(input_ids), "attention_mask": attention_mask,
              "masked_positions": torch.tensor([[2, 5, 7], [0, 0, 0], [1, 4, 0]]),
              "masked_lm_labels": torch.tensor([[11, 12, 13], [-100, -100, -100], [14, 15, -100]]),
              "next_sentence_labels": torch.tensor([0, 1, 1])}
    assert P == inputs["masked_positions"].shape[1]
    index = token_index(attention_mask)
    assert index[12:14].tolist() == [12, 13] and len(index) == 23
    assert_same_states(model, inputs, index)
    assert_same_step(model, inputs, index)


def test_attention_dropout_draws_the_padded_masks(batch_factory):
    """Attention dropout is drawn over (B, nh, T, T) in both encoders (attention runs padded): with it alone, a
    training step is the padded one, random numbers included."""
    model = mini_model(attention_dropout=0.1).train()
    inputs = pretraining_inputs(batch_factory(VOCAB, lengths=(40, 33, 17, 5), max_predictions=6))
    assert_same_step(model, inputs, token_index(inputs["attention_mask"], 8))


def test_hidden_dropout_draws_other_masks_of_the_same_rate(batch_factory):
    """Hidden-state dropout is drawn over (N, C) instead of (B, T, C): other numbers, so another (finite) loss for a
    seed; over seeds, the same mean as the padded encoder's (a valid training, not the same one)."""
    model = mini_model(hidden_dropout=0.1, attention_dropout=0.1).train()
    inputs = pretraining_inputs(batch_factory(VOCAB, lengths=(40, 33, 17, 5), max_predictions=6))
    index = token_index(inputs["attention_mask"], 8)
    padded, unpadded = [], []
    for seed in range(12):
        padded_out, _ = run(model, inputs, None, seed)
        unpadded_out, grads = run(model, inputs, index, seed)
        assert all(torch.isfinite(grad).all() for grad in grads.values())
        padded.append(padded_out.loss.item())
        unpadded.append(unpadded_out.loss.item())
    assert padded != unpadded
    mean_padded, mean_unpadded = sum(padded) / len(padded), sum(unpadded) / len(unpadded)
    spread = torch.tensor(padded).std().item()
    assert abs(mean_unpadded - mean_padded) < spread, (padded, unpadded)


def test_an_index_that_leaves_positions_out_needs_the_mask(batch_factory):
    """Positions left out hold zero keys in attention: only the attention_mask keeps them out of the softmax."""
    model = mini_model().eval()
    inputs = pretraining_inputs(batch_factory(VOCAB, lengths=(40, 33, 17, 5), max_predictions=6))
    with pytest.raises(ValueError, match="covers 96 of 160 positions, but there is no attention_mask"):
        model(**{**inputs, "attention_mask": None}, token_index=token_index(inputs["attention_mask"], 8))


@pytest.mark.slow
def test_the_unpadded_model_compiles_as_one_graph(batch_factory):
    """model.compile's settings (pipeline/pretraining/compiled.py: fullgraph, dynamic=False): no graph break, and the
    compiled step is the eager one up to inductor's reordered float sums."""
    model = mini_model().eval()
    inputs = pretraining_inputs(batch_factory(VOCAB, lengths=(40, 33, 17, 5), max_predictions=6))
    index = token_index(inputs["attention_mask"], 16)
    eager, eager_grads = run(model, inputs, index)
    model.compile(fullgraph=True, dynamic=False)
    compiled, compiled_grads = run(model, inputs, index)
    torch.testing.assert_close(compiled.loss, eager.loss, rtol=1e-5, atol=0)
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
