import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from model import PEAK_FLOPS, BertConfig, BertForPreTraining, BertModel, flops_per_token, mfu, peak_flops_for_device

REPO_ROOT = Path(__file__).resolve().parents[2]
VOCAB = 1000


def tiny_config(**overrides) -> BertConfig:
    return BertConfig.from_preset("tiny", vocab_size=VOCAB, **overrides)


def pretraining_inputs(batch: dict, gathered: bool = True) -> dict:
    inputs = {key: batch[key] for key in ("input_ids", "token_type_ids", "attention_mask", "next_sentence_labels")}
    if gathered:
        inputs.update(masked_positions=batch["masked_positions"], masked_lm_labels=batch["masked_lm_labels"])
    else:
        inputs.update(masked_lm_labels=batch["full_mlm_labels"])
    return inputs


def test_gathered_mlm_equals_full_sequence_mlm(batch_factory):
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config()).eval()
    batch = batch_factory(VOCAB)
    with torch.no_grad():
        gathered = model(**pretraining_inputs(batch, gathered=True))
        full = model(**pretraining_inputs(batch, gathered=False))
    B, P = batch["masked_positions"].shape
    T = batch["input_ids"].shape[1]
    assert gathered.mlm_logits.shape == (B, P, VOCAB)
    assert full.mlm_logits.shape == (B, T, VOCAB)
    assert gathered.nsp_logits.shape == full.nsp_logits.shape == (B, 2)
    at_positions = full.mlm_logits[torch.arange(B)[:, None], batch["masked_positions"]]  # (B, P, V)
    torch.testing.assert_close(gathered.mlm_logits, at_positions, rtol=0, atol=1e-5)
    torch.testing.assert_close(gathered.mlm_loss, full.mlm_loss, rtol=0, atol=1e-6)
    torch.testing.assert_close(gathered.loss, full.loss, rtol=0, atol=1e-6)
    assert gathered.mlm_total == full.mlm_total == (batch["masked_lm_labels"] != -100).sum()
    assert gathered.mlm_correct == full.mlm_correct


def test_losses_and_accuracy_counts(batch_factory):
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config()).eval()
    batch = batch_factory(VOCAB)
    with torch.no_grad():
        out = model(**pretraining_inputs(batch))
    labels = batch["masked_lm_labels"]
    counted = labels != -100
    expected_mlm = nn.functional.cross_entropy(out.mlm_logits[counted], labels[counted])
    expected_nsp = nn.functional.cross_entropy(out.nsp_logits, batch["next_sentence_labels"])
    torch.testing.assert_close(out.mlm_loss, expected_mlm)
    torch.testing.assert_close(out.nsp_loss, expected_nsp)
    torch.testing.assert_close(out.loss, expected_mlm + expected_nsp)
    assert out.mlm_total == counted.sum()
    assert out.mlm_correct == (out.mlm_logits.argmax(-1) == labels)[counted].sum()
    assert out.nsp_total == len(batch["next_sentence_labels"])
    assert out.nsp_correct == (out.nsp_logits.argmax(-1) == batch["next_sentence_labels"]).sum()


def test_loss_options(batch_factory):
    model = BertForPreTraining(tiny_config()).eval()
    batch = batch_factory(VOCAB)
    inputs = {key: batch[key] for key in ("input_ids", "token_type_ids", "attention_mask", "masked_positions")}
    with torch.no_grad():
        assert model(**inputs).loss is None
        mlm_only = model(**inputs, masked_lm_labels=batch["masked_lm_labels"])
        assert mlm_only.loss is mlm_only.mlm_loss and mlm_only.nsp_loss is None
        # a batch with nothing to predict gives 0, not NaN
        nothing = model(**inputs, masked_lm_labels=torch.full_like(batch["masked_lm_labels"], -100))
        assert nothing.mlm_loss == 0 and nothing.mlm_total == 0
        with pytest.raises(ValueError, match="masked_lm_labels has shape"):
            model(**inputs, masked_lm_labels=batch["full_mlm_labels"])


def test_padding_does_not_change_the_real_tokens(batch_factory):
    torch.manual_seed(0)
    model = BertModel(tiny_config()).eval()
    batch = batch_factory(VOCAB)
    row, length = 2, int(batch["attention_mask"][2].sum())
    with torch.no_grad():
        padded = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        alone = model(batch["input_ids"][row:row + 1, :length], batch["token_type_ids"][row:row + 1, :length])
    torch.testing.assert_close(padded.sequence_output[row, :length], alone.sequence_output[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(padded.pooled_output[row], alone.pooled_output[0], rtol=0, atol=1e-5)


def test_encoder_outputs(batch_factory):
    config = tiny_config()
    model = BertModel(config).eval()
    batch = batch_factory(VOCAB)
    B, T = batch["input_ids"].shape
    with torch.no_grad():
        out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], output_hidden_states=True)
        default = model(batch["input_ids"])
    assert out.sequence_output.shape == (B, T, config.hidden_size)
    assert out.pooled_output.shape == (B, config.hidden_size)
    assert len(out.hidden_states) == config.num_layers + 1
    assert out.hidden_states[-1] is out.sequence_output
    assert default.hidden_states is None and default.sequence_output.shape == (B, T, config.hidden_size)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
        model(torch.zeros(1, config.max_position_embeddings + 1, dtype=torch.long))


def test_the_residual_stream_is_bf16_under_bf16_autocast_and_fp32_without(batch_factory):
    """Issue 35, item 4: autocast's LayerNorm returns fp32; the stream between the blocks is cast back to bf16, so the
    blocks' outputs (and the activations saved from them) are half the bytes. The losses stay fp32."""
    model = BertForPreTraining(tiny_config()).train()
    batch = batch_factory(VOCAB)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        states = model.bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                            output_hidden_states=True).hidden_states
        out = model(**pretraining_inputs(batch))
    assert {state.dtype for state in states} == {torch.bfloat16}
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    out.loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)
    states = model.bert(batch["input_ids"], output_hidden_states=True).hidden_states
    assert {state.dtype for state in states} == {torch.float32}


def test_initialisation():
    config = tiny_config()
    model = BertForPreTraining(config)
    embedding = model.bert.embeddings.word_embeddings.weight
    assert abs(embedding.std().item() - config.initializer_range) < 0.002
    assert abs(model.bert.layers[0].feed_forward.fc_in.weight.std().item() - config.initializer_range) < 0.002
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            assert torch.all(module.weight == 1) and torch.all(module.bias == 0)
        if isinstance(module, nn.Linear):
            assert torch.all(module.bias == 0)


def test_tied_embedding_gets_gradient_from_decoder_and_input(batch_factory):
    torch.manual_seed(0)
    tied = BertForPreTraining(tiny_config(hidden_dropout=0.0, attention_dropout=0.0))
    embedding = tied.bert.embeddings.word_embeddings.weight
    assert tied.mlm_head.decoder.weight is embedding
    num_parameters = sum(p.numel() for p in tied.parameters())
    assert num_parameters == sum(p.numel() for name, p in tied.state_dict().items()
                                 if name != "mlm_head.decoder.weight")

    # The same weights with the decoder untied: the tied gradient must be the sum of the two separate ones.
    untied = copy.deepcopy(tied)
    untied.mlm_head.decoder.weight = nn.Parameter(untied.bert.embeddings.word_embeddings.weight.detach().clone())
    batch = batch_factory(VOCAB)
    tied(**pretraining_inputs(batch)).loss.backward()
    untied(**pretraining_inputs(batch)).loss.backward()
    input_side = untied.bert.embeddings.word_embeddings.weight.grad
    decoder_side = untied.mlm_head.decoder.weight.grad
    torch.testing.assert_close(embedding.grad, input_side + decoder_side, rtol=0, atol=1e-7)

    seen = torch.zeros(VOCAB, dtype=torch.bool)
    seen[batch["input_ids"][batch["attention_mask"] == 1].unique()] = True
    assert input_side[seen].abs().sum(dim=1).gt(0).all()   # every real input token's row, from the lookup
    assert input_side[~seen].eq(0).all()                    # ... and no other row: not even [PAD], which
    assert not seen[0]                                      # fills the batch but is never attended to
    assert decoder_side.abs().sum(dim=1).gt(0).all()        # every row, from the softmax over the vocabulary
    assert embedding.grad[~seen].abs().sum(dim=1).gt(0).all()


def test_trains_on_a_fixed_batch(batch_factory):
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = pretraining_inputs(batch_factory(VOCAB))
    losses = []
    for _ in range(15):
        loss = model(**inputs).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_model_package_needs_no_transformers():
    code = (
        "import sys; sys.modules['transformers'] = None; sys.modules['safetensors'] = None\n"
        "import torch; torch.set_num_threads(1)\n"
        "import model, model.bert.hf_conversion\n"
        "m = model.BertForPreTraining(model.BertConfig.from_preset('tiny', vocab_size=100))\n"
        "ids = torch.randint(0, 100, (2, 8))\n"
        "m(ids, None, None, torch.zeros(2, 1, dtype=torch.long), ids[:, :1], ids[:, 0] % 2).loss.backward()\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=120)


# ----------------------------------------------------------------------------------------------------------
# FLOPs

def test_flops_per_token_by_hand():
    config = tiny_config()   # L=2, C=128, I=512, V=1000
    T, P = 128, 20
    encoder = 2 * (4 * 128 * 128 + 2 * 128 * 512)          # 393,216 weights at every token
    mlm_head = (128 * 128 + 128 * 1000) * P / T            # 144,384 weights at 20 of 128 tokens: 22,560
    pooler_and_nsp = (128 * 128 + 2 * 128) / T             # once per sequence: 130
    attention = 12 * 2 * 128 * T                           # 393,216
    expected = 6 * (encoder + mlm_head + pooler_and_nsp) + attention
    assert expected == 2_888_652
    assert flops_per_token(config, T, P) == pytest.approx(expected, rel=1e-12)


def matmul_weights(model: BertForPreTraining) -> tuple[int, int]:
    """(weights of all matmuls, those of them applied once per sequence: pooler and NSP).

    The tied decoder counts once, as a matmul; embedding lookups are not matmuls.
    """
    total = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return total, sum(m.weight.numel() for m in (model.bert.pooler.dense, model.nsp_head))


@pytest.mark.parametrize("preset", ["tiny", "base"])
def test_flops_per_token_is_6n_when_attention_is_negligible(preset):
    config = BertConfig.from_preset(preset, vocab_size=VOCAB if preset == "tiny" else 30522)
    with torch.device("meta"):   # shapes only
        total, per_sequence = matmul_weights(BertForPreTraining(config))
    T = 512   # every position predicted: apart from attention, 6 FLOPs per weight per token
    attention = 12 * config.num_layers * config.hidden_size * T
    without_attention = flops_per_token(config, T, num_masked_per_seq=T) - attention
    assert without_attention == pytest.approx(6 * (total - per_sequence) + 6 * per_sequence / T, rel=1e-12)
    if preset == "base":   # the pooler is 0.5% of BERT-base's matmul weights
        assert without_attention == pytest.approx(6 * total, rel=0.01)


def test_flops_per_token_matches_pytorchs_flop_counter(batch_factory):
    """Counts every matmul of a real forward + backward step (attention through SDPA's math kernel)."""
    config = tiny_config()
    model = BertForPreTraining(config)
    batch = batch_factory(VOCAB, lengths=(32, 20), max_predictions=5)
    B, T = batch["input_ids"].shape
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        model(**pretraining_inputs(batch)).loss.backward()
    assert counter.get_total_flops() == pytest.approx(flops_per_token(config, T, 5) * B * T, rel=1e-9)


def test_mfu_and_peak_flops():
    config = BertConfig.from_preset("base")
    per_token = flops_per_token(config, 128, 20)
    assert per_token == pytest.approx(6 * 85e6 + 12 * 12 * 768 * 128 + 6 * (768 * 768 + 768 * 30522) * 20 / 128,
                                      rel=0.01)
    tokens_per_second = 0.4 * 989e12 / per_token * 8
    assert mfu(config, 128, 20, tokens_per_second, "h100-sxm", num_gpus=8) == pytest.approx(0.4)
    assert mfu(config, 128, 20, tokens_per_second / 8, 989e12) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="unknown GPU"):
        mfu(config, 128, 20, 1.0, "tpu")
    assert peak_flops_for_device("NVIDIA H100 80GB HBM3") == PEAK_FLOPS["h100-sxm"] == 989e12
    assert peak_flops_for_device("NVIDIA H100 PCIe") == PEAK_FLOPS["h100-pcie"]
    assert peak_flops_for_device("NVIDIA H200") == 989e12
    assert peak_flops_for_device("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops_for_device("NVIDIA A10G") == PEAK_FLOPS["a10g"]
    assert peak_flops_for_device("NVIDIA A10") == 125e12
    assert peak_flops_for_device("Tesla V100-SXM2-16GB") == 125e12
    assert peak_flops_for_device("NVIDIA H100 NVL") is None
    assert peak_flops_for_device("NVIDIA GeForce GTX 1080") is None


# ----------------------------------------------------------------------------------------------------------
# The CPU training fast paths: dropout, attention with dropout, cross-entropy

def test_dropout_keeps_1_minus_p_and_rescales():
    from model.shared.dropout import dropout
    x = torch.randn(200, 500)
    assert dropout(x, 0.1, training=False) is x and dropout(x, 0.0, training=True) is x
    torch.manual_seed(0)
    y = dropout(x.requires_grad_(), 0.1, training=True)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.9) < 0.005   # 100,000 draws: 0.005 is > 5 standard deviations
    torch.testing.assert_close(y[kept], x[kept] / 0.9, rtol=1e-6, atol=0)
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() / 0.9, rtol=1e-6, atol=0)


def test_training_attention_equals_sdpa_when_nothing_is_dropped(batch_factory):
    from model.bert.model import attention_with_dropout, key_padding_mask
    batch = batch_factory(VOCAB)
    B, T = batch["input_ids"].shape
    q, k, v = (torch.randn(B, 2, T, 64, requires_grad=True) for _ in range(3))
    mask = key_padding_mask(batch["attention_mask"])
    grad = torch.randn(B, 2, T, 64)
    torch.manual_seed(0)
    mine = attention_with_dropout(q, k, v, mask, dropout_p=1e-9)   # a uniform draw below 1e-9 is exactly 0
    mine_grads = torch.autograd.grad(mine, (q, k, v), grad)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    reference_grads = torch.autograd.grad(reference, (q, k, v), grad)
    torch.testing.assert_close(mine, reference, rtol=0, atol=1e-6)
    for a, b in zip(mine_grads, reference_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # with real dropout, about p of the attention probabilities are dropped: the output changes
    torch.manual_seed(0)
    assert not torch.allclose(attention_with_dropout(q, k, v, mask, dropout_p=0.1), reference, atol=1e-3)


def test_cross_entropy_equals_torchs_and_refuses_a_second_backward():
    from model.shared.losses import _SummedCrossEntropy
    torch.manual_seed(0)
    logits = torch.randn(50, 300, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 300, (50,))
    labels[::7] = -100
    mine = _SummedCrossEntropy.apply(logits, labels)
    (mine_grad,) = torch.autograd.grad(3 * mine, logits, retain_graph=True)
    reference = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
    (reference_grad,) = torch.autograd.grad(3 * reference, logits)
    torch.testing.assert_close(mine, reference, rtol=0, atol=1e-12)
    torch.testing.assert_close(mine_grad, reference_grad, rtol=0, atol=1e-12)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        mine.backward()   # its saved log-probabilities became the gradient
