"""BERT's MLM decoder over a vocabulary padded to a multiple of 64 (issue 48 item 4; model/shared/vocab_padding.py): the
same logits and gradients as the unpadded decoder, the parameters' shapes unchanged, and the real train() with
model.pad_vocab_to_multiple_of=64 trains the losses of the run without it."""
from __future__ import annotations

import csv

import pytest
import torch

from model import BertConfig, BertForPreTraining
from model.shared.vocab_padding import padded_vocab_linear


@pytest.mark.parametrize("vocab", [30522, 30528, 7])
def test_the_padded_matmul_gives_the_logits_and_gradients_of_the_plain_one(vocab):
    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 16, requires_grad=True)
    weight, bias = torch.randn(vocab, 16, requires_grad=True), torch.randn(vocab, requires_grad=True)
    padded = padded_vocab_linear(hidden, weight, bias, 64)
    plain = torch.nn.functional.linear(hidden, weight, bias)
    assert padded.shape == plain.shape == (3, 5, vocab)
    torch.testing.assert_close(padded, plain, rtol=1e-6, atol=1e-5)
    upstream = torch.randn_like(plain)
    grads = torch.autograd.grad(padded, (hidden, weight, bias), upstream)
    expected = torch.autograd.grad(plain, (hidden, weight, bias), upstream)
    for got, want in zip(grads, expected, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)


def test_bert_with_the_padded_decoder_scores_as_without_it_and_keeps_its_parameters():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny")).eval()
    ids = torch.randint(5, 30000, (2, 12))
    positions = torch.tensor([[1, 4, 7], [2, 3, 9]])
    plain = model(ids, masked_positions=positions).mlm_logits
    shapes = {name: p.shape for name, p in model.named_parameters()}
    model.mlm_head.vocab_multiple = 64
    padded = model(ids, masked_positions=positions).mlm_logits
    assert padded.shape == plain.shape == (2, 3, 30522)
    torch.testing.assert_close(padded, plain, rtol=1e-6, atol=1e-5)
    assert {name: p.shape for name, p in model.named_parameters()} == shapes


def test_a_run_with_the_padded_decoder_trains_the_losses_of_one_without(small_shards, tmp_path, tiny_overrides,
                                                                         monkeypatch):
    import model.bert.model
    from pipeline.core.app import compose
    from pipeline.pretraining.run import train

    widths = []

    def padded_and_seen(hidden, weight, bias, multiple):
        widths.append(weight.shape[0] + -weight.shape[0] % multiple)
        return padded_vocab_linear(hidden, weight, bias, multiple)

    monkeypatch.setattr(model.bert.model, "padded_vocab_linear", padded_and_seen)

    def losses(out, *extra):
        train(compose("train", [*tiny_overrides(small_shards, out, 4), "trainer.log_every_n_steps=1",
                                "export.hf=false", "export.plot=false", "callbacks.checkpoint.every_n_train_steps=0",
                                *extra]))
        with open(out / "csv" / "metrics.csv", newline="") as handle:
            return [float(row["train/loss"]) for row in csv.DictReader(handle) if row.get("train/loss")]

    plain = losses(tmp_path / "plain")
    assert widths == []
    padded = losses(tmp_path / "padded", "model.pad_vocab_to_multiple_of=64")
    assert widths and set(widths) == {30528}
    assert len(plain) == 4 and padded == pytest.approx(plain, rel=1e-5)
