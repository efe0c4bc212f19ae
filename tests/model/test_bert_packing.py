"""MLPerf-style packing (Krell et al. 2021): sentence pairs packed into rows, each attending only within itself, give
the losses, accuracies, logits and gradients of the same pairs run one per row, and no pair reaches another."""
import pytest
import torch

from model import BertConfig, BertForPreTraining
from tests.model.conftest import make_batch

VOCAB = 1000
LENGTHS = (20, 7, 33, 12, 5, 40, 9)   # pair lengths, [CLS] and [SEP]s included
ROWS = ((5, 3, 1), (2, 0, 4), (6,))   # pairs per packed row: an unsorted mix, and a row of one
T = 64                                 # packed row width (row 1 holds 33 + 20 + 5 = 58 tokens)
K = 3                                  # pair slots per packed row
PREDICTIONS = 6
RTOL, ATOL = 1e-5, 1e-6


def pack_by_hand(batch: dict) -> dict:
    """The packed rows of `batch` (one pair per row, conftest.make_batch's layout) after ROWS, as the model takes
    them; written out directly from the definition, independent of the training collator's packing."""
    R = len(ROWS)
    packed = {name: torch.zeros(R, T, dtype=torch.long)
              for name in ("input_ids", "token_type_ids", "attention_mask", "position_ids")}
    packed["document_ids"] = torch.full((R, T), -1, dtype=torch.long)
    packed["cls_positions"] = torch.zeros(R, K, dtype=torch.long)
    packed["next_sentence_labels"] = torch.full((R, K), -100, dtype=torch.long)
    packed["masked_positions"] = torch.zeros(R, K * PREDICTIONS, dtype=torch.long)
    packed["masked_lm_labels"] = torch.full((R, K * PREDICTIONS), -100, dtype=torch.long)
    for r, pairs in enumerate(ROWS):
        start, slot = 0, 0
        for k, pair in enumerate(pairs):
            n = LENGTHS[pair]
            span = slice(start, start + n)
            for name in ("input_ids", "token_type_ids", "attention_mask"):
                packed[name][r, span] = batch[name][pair, :n]
            packed["position_ids"][r, span] = torch.arange(n)
            packed["document_ids"][r, span] = k
            packed["cls_positions"][r, k] = start
            packed["next_sentence_labels"][r, k] = batch["next_sentence_labels"][pair]
            counted = batch["masked_lm_labels"][pair] != -100
            m = int(counted.sum())
            packed["masked_positions"][r, slot:slot + m] = batch["masked_positions"][pair, counted] + start
            packed["masked_lm_labels"][r, slot:slot + m] = batch["masked_lm_labels"][pair, counted]
            start, slot = start + n, slot + m
    return packed


def unpacked_inputs(batch: dict) -> dict:
    names = ("input_ids", "token_type_ids", "attention_mask", "masked_positions", "masked_lm_labels",
             "next_sentence_labels")
    return {name: batch[name] for name in names}


def run(model: BertForPreTraining, inputs: dict):
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    out.loss.backward()
    return out, {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = BertConfig.from_preset("tiny", vocab_size=VOCAB, max_position_embeddings=T)
    return BertForPreTraining(config).eval()   # eval: no dropout, so both runs compute the same function


@pytest.fixture(scope="module")
def batch():
    return make_batch(VOCAB, lengths=LENGTHS, max_predictions=PREDICTIONS, seed=3)


def max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs() / (b.abs() + ATOL / RTOL)).max())


@pytest.mark.parametrize("unpadded", [False, True])
def test_packed_rows_train_as_the_pairs_one_per_row(model, batch, unpadded):
    assert sorted(p for row in ROWS for p in row) == list(range(len(LENGTHS)))
    packed = pack_by_hand(batch)
    if unpadded:   # the layers on the real tokens only (model/shared/unpadding.py), as data.unpad runs them
        packed["token_index"] = packed["attention_mask"].flatten().nonzero().squeeze(1)
    one_per_row, grads = run(model, unpacked_inputs(batch))
    packed_out, packed_grads = run(model, packed)

    # The losses average as the unpacked batch's: per scored token over the batch, and per pair.
    for name in ("loss", "mlm_loss", "nsp_loss"):
        torch.testing.assert_close(getattr(packed_out, name), getattr(one_per_row, name), rtol=RTOL, atol=ATOL)
    for name in ("mlm_correct", "mlm_total", "nsp_correct", "nsp_total"):
        assert int(getattr(packed_out, name)) == int(getattr(one_per_row, name)), name
    assert int(packed_out.nsp_total) == len(LENGTHS)

    counted = packed["masked_lm_labels"] != -100
    in_pair_order = torch.cat([one_per_row.mlm_logits[p][batch["masked_lm_labels"][p] != -100]
                               for row in ROWS for p in row])
    torch.testing.assert_close(packed_out.mlm_logits[counted], in_pair_order, rtol=RTOL, atol=ATOL)
    nsp_in_pair_order = torch.stack([one_per_row.nsp_logits[p] for row in ROWS for p in row])
    torch.testing.assert_close(packed_out.nsp_logits[packed["next_sentence_labels"] != -100], nsp_in_pair_order,
                               rtol=RTOL, atol=ATOL)

    assert grads.keys() == packed_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=RTOL, atol=ATOL, msg=name)
    print(f"\nunpadded={unpadded}: |loss diff| {float((packed_out.loss - one_per_row.loss).abs().detach()):.2e}, "
          f"max rel grad diff {max(max_rel_diff(packed_grads[n], g) for n, g in grads.items()):.2e}, "
          f"max abs grad diff {max(float((packed_grads[n] - g).abs().max()) for n, g in grads.items()):.2e}")


def test_a_pair_never_sees_another(model, batch):
    """Changing every token of one pair changes that pair's states and no other's."""
    packed = pack_by_hand(batch)
    changed = {**packed, "input_ids": packed["input_ids"].clone()}
    row, pair = 1, 1                                   # the middle pair of row 1 (pair 0 of the batch)
    start, n = int(packed["cls_positions"][row, pair]), LENGTHS[ROWS[row][pair]]
    changed["input_ids"][row, start + 1:start + n - 1] = torch.randint(5, VOCAB, (n - 2,),
                                                                       generator=torch.Generator().manual_seed(1))
    encode = {name: packed[name] for name in ("token_type_ids", "attention_mask", "document_ids", "position_ids")}
    with torch.no_grad():
        before = model.bert(packed["input_ids"], **encode).sequence_output
        after = model.bert(changed["input_ids"], **encode).sequence_output
    others = torch.ones(T, dtype=torch.bool)
    others[start:start + n] = False
    assert torch.equal(before[row, others], after[row, others])
    assert (before[row, start:start + n] - after[row, start:start + n]).abs().max() > 1e-2   # the change is seen
    assert torch.equal(before[[0, 2]], after[[0, 2]])


def test_packed_rows_need_their_cls_positions_for_nsp(model, batch):
    packed = pack_by_hand(batch)
    del packed["cls_positions"]
    with pytest.raises(ValueError, match="cls_positions"):
        model(**packed)


def test_one_label_per_pair_slot(model, batch):
    packed = pack_by_hand(batch)
    packed["next_sentence_labels"] = packed["next_sentence_labels"][:, 0]
    with pytest.raises(ValueError, match=r"next_sentence_labels has shape \(3,\), expected \(3, 3\)"):
        model(**packed)


def test_dropout_path_trains_packed_rows(batch):
    """In training with attention dropout, the CPU path (attention_with_dropout) takes the (B, 1, T, T) mask: finite
    losses and gradients, and a pair still never sees another."""
    torch.manual_seed(0)
    config = BertConfig.from_preset("tiny", vocab_size=VOCAB, max_position_embeddings=T)
    model = BertForPreTraining(config).train()
    packed = pack_by_hand(batch)
    out = model(**packed)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
