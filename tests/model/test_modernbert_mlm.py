"""Our ModernBertForMaskedLM against transformers' (fp32, eval), both ways, on padded and unpadded batches, through
both attention paths; and its training interface (BertForPreTraining's)."""
import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from model.modernbert import ModernBertConfig, ModernBertForMaskedLM, ModernBertModel  # noqa: E402
from model.modernbert.hf_conversion import from_hf_state_dict, to_hf_state_dict  # noqa: E402
from tests.model.modernbert_common import (  # noqa: E402
    ATOL,
    CONFIG,
    FLEX_WARNING,
    VOCAB,
    hf_model,
    max_abs_diff,
    padded_batch,
    with_backend,
)

pytestmark = pytest.mark.filterwarnings(FLEX_WARNING)


def our_logits(model, batch: dict, unpadded: bool) -> torch.Tensor:
    token_index = batch["token_index"] if unpadded else None
    with torch.no_grad():
        return model(batch["input_ids"], attention_mask=batch["attention_mask"], token_index=token_index).mlm_logits


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_hf_to_ours_parity(attn_implementation):
    hf = hf_model("ModernBertForMaskedLM", attn_implementation=attn_implementation)
    assert hf.config._attn_implementation == attn_implementation
    batch = padded_batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    diffs = {}
    for backend in ("sdpa", "flex"):
        ours = from_hf_state_dict(hf.state_dict(), with_backend(CONFIG, backend)).eval()
        for unpadded in (False, True):
            diffs[backend, unpadded] = max_abs_diff(our_logits(ours, batch, unpadded)[real], theirs[real])
    print(f"\nhf({attn_implementation}) -> ours max abs diffs (backend, unpadded): {diffs}")
    assert max(diffs.values()) <= ATOL, diffs


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_ours_to_hf_parity(backend):
    torch.manual_seed(1)
    ours = ModernBertForMaskedLM(with_backend(CONFIG, backend)).eval()
    hf_state = to_hf_state_dict(ours)
    for attn_implementation in ("sdpa", "eager"):
        hf = hf_model("ModernBertForMaskedLM", attn_implementation=attn_implementation, seed=2)
        assert set(hf_state) == set(hf.state_dict())  # exactly transformers' names, the tied alias included
        hf.load_state_dict(hf_state, strict=True)
        assert hf.decoder.weight is hf.model.embeddings.tok_embeddings.weight  # still tied
        batch = padded_batch(seed=3)
        real = batch["attention_mask"].bool()
        with torch.no_grad():
            theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            no_padding = hf(input_ids=batch["input_ids"]).logits
            mine_no_padding = ours(batch["input_ids"]).mlm_logits
        for unpadded in (False, True):
            assert max_abs_diff(our_logits(ours, batch, unpadded)[real], theirs[real]) <= ATOL
        assert max_abs_diff(mine_no_padding, no_padding) <= ATOL


def test_local_layers_really_attend_locally():
    """The window matters at these lengths: with a window covering the row, the outputs change, by far more than the
    parity tolerance (so that the parity tests see a wrong window)."""
    torch.manual_seed(0)
    ours = ModernBertForMaskedLM(CONFIG).eval()
    wide = ModernBertForMaskedLM(ModernBertConfig(**{**CONFIG.__dict__, "local_attention": 96})).eval()
    wide.load_state_dict(ours.state_dict())
    batch = padded_batch()
    assert max_abs_diff(our_logits(ours, batch, False), our_logits(wide, batch, False)) > 100 * ATOL


def test_hidden_states_as_transformers():
    hf = hf_model("ModernBertModel")
    encoder = ModernBertModel(CONFIG).eval()
    encoder.load_state_dict(hf.state_dict(), strict=True)  # the same names inside the encoder
    batch = padded_batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
        for token_index in (None, batch["token_index"]):
            mine = encoder(batch["input_ids"], batch["attention_mask"], token_index=token_index,
                           output_hidden_states=True)
            assert mine.pooled_output is None
            assert len(mine.hidden_states) == len(theirs.hidden_states) == CONFIG.num_layers + 1
            for a, b in zip(mine.hidden_states, theirs.hidden_states):
                assert max_abs_diff(a[real], b[real]) <= ATOL
            assert max_abs_diff(mine.sequence_output[real], theirs.last_hidden_state[real]) <= ATOL


def test_training_interface_and_loss():
    """BertForPreTraining's keywords: masked positions gathered before the head give transformers' loss over its
    (B, T) labels; token_type_ids are ignored; next-sentence labels are refused."""
    hf = hf_model("ModernBertForMaskedLM")
    ours = from_hf_state_dict(hf.state_dict(), CONFIG).eval()
    assert ours.next_sentence_prediction is False
    batch = padded_batch()
    masked_positions = torch.tensor([[1, 5, 40, 0], [2, 30, 0, 0], [3, 0, 0, 0]])
    masked_lm_labels = torch.tensor([[7, 8, 9, -100], [10, 11, -100, -100], [12, -100, -100, -100]])
    full_labels = torch.full(batch["input_ids"].shape, -100)
    for b in range(3):
        for position, label in zip(masked_positions[b], masked_lm_labels[b]):
            if label != -100:
                full_labels[b, position] = label
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        theirs = hf(**inputs, labels=full_labels)
        gathered = ours(**inputs, token_type_ids=torch.ones_like(batch["input_ids"]),
                        masked_positions=masked_positions, masked_lm_labels=masked_lm_labels)
        full = ours(**inputs, masked_lm_labels=full_labels, token_index=batch["token_index"])
    assert gathered.nsp_logits is None and gathered.mlm_logits.shape == (3, 4, VOCAB)
    assert abs(gathered.loss.item() - theirs.loss.item()) <= ATOL
    assert abs(full.loss.item() - theirs.loss.item()) <= ATOL
    hf_loss = F.cross_entropy(theirs.logits.reshape(-1, VOCAB), full_labels.reshape(-1))
    assert abs(gathered.mlm_loss.item() - hf_loss.item()) <= ATOL
    assert gathered.mlm_total.item() == 6 and full.mlm_total.item() == 6
    with pytest.raises(ValueError, match="no next-sentence head"):
        ours(**inputs, next_sentence_labels=torch.zeros(3, dtype=torch.long))


def test_tied_decoder_trains_one_parameter():
    torch.manual_seed(0)
    ours = ModernBertForMaskedLM(CONFIG)
    assert ours.decoder.weight is ours.encoder.embeddings.tok_embeddings.weight
    batch = padded_batch()
    out = ours(batch["input_ids"], attention_mask=batch["attention_mask"], token_index=batch["token_index"],
               masked_positions=torch.tensor([[1], [2], [3]]), masked_lm_labels=torch.tensor([[7], [8], [9]]))
    out.loss.backward()
    assert ours.decoder.weight.grad is not None and torch.isfinite(ours.decoder.weight.grad).all()
    # the lookup gives [PAD]'s row no gradient (padding_idx, as transformers); the decoder does
    assert ours.decoder.weight.grad[CONFIG.pad_token_id].abs().sum() > 0


def test_init_as_transformers():
    """Truncated normals with transformers' stds: Wo's at initializer_range / sqrt(2 L), within the cutoff."""
    torch.manual_seed(0)
    ours = ModernBertForMaskedLM(ModernBertConfig.from_preset("modernbert_mini", vocab_size=VOCAB))
    config = ours.config
    out_std = config.initializer_range / (2 * config.num_layers) ** 0.5
    for name, std in (("layers.1.attn.Wqkv", config.initializer_range), ("layers.1.attn.Wo", out_std),
                      ("layers.1.mlp.Wi", config.initializer_range), ("layers.1.mlp.Wo", out_std)):
        weight = ours.encoder.get_submodule(name).weight
        assert weight.abs().max() <= config.initializer_cutoff_factor * std + 1e-9, name
        assert abs(weight.std().item() - std * 0.88) < std * 0.1, name  # a normal cut at 2 std keeps 0.88 std
    assert torch.equal(ours.decoder.bias, torch.zeros(VOCAB))
    assert torch.equal(ours.encoder.final_norm.weight, torch.ones(config.hidden_size))


def test_trains_under_bf16_autocast():
    """A mixed-precision step: finite loss and gradients, the residual stream kept in fp32 (pre-LN sums every layer)."""
    torch.manual_seed(0)
    ours = ModernBertForMaskedLM(CONFIG)
    batch = padded_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        encoded = ours.encoder(batch["input_ids"], batch["attention_mask"], token_index=batch["token_index"])
        out = ours(batch["input_ids"], attention_mask=batch["attention_mask"], token_index=batch["token_index"],
                   masked_positions=torch.tensor([[1], [2], [3]]), masked_lm_labels=torch.tensor([[7], [8], [9]]))
    assert encoded.sequence_output.dtype == torch.float32
    out.loss.backward()
    assert torch.isfinite(out.loss) and all(torch.isfinite(p.grad).all() for p in ours.parameters())
