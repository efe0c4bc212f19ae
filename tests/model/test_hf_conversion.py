"""Our model against transformers' BertForPreTraining, built from the same config with random weights."""
import copy
import json

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from model import BertConfig, BertForPreTraining  # noqa: E402
from model.bert.hf_conversion import config_from_hf, from_hf_state_dict, hf_config_from, to_hf_state_dict  # noqa: E402
from model.bert.hf_files import export_hf  # noqa: E402

VOCAB = 1000
ATOL = 1e-5


def hf_model(config: BertConfig, attn_implementation: str, seed: int = 0):
    torch.manual_seed(seed)
    return transformers.BertForPreTraining(hf_config_from(config, attn_implementation=attn_implementation)).eval()


def hf_outputs(model, batch: dict):
    return model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                 attention_mask=batch["attention_mask"], labels=batch["full_mlm_labels"],
                 next_sentence_label=batch["next_sentence_labels"])


def our_outputs(model, batch: dict, gathered: bool):
    inputs = {key: batch[key] for key in ("input_ids", "token_type_ids", "attention_mask", "next_sentence_labels")}
    if gathered:
        return model(**inputs, masked_positions=batch["masked_positions"], masked_lm_labels=batch["masked_lm_labels"])
    return model(**inputs, masked_lm_labels=batch["full_mlm_labels"])


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("preset", ["tiny", "mini"])
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_hf_to_ours_parity(preset, attn_implementation, batch_factory):
    config = BertConfig.from_preset(preset, vocab_size=VOCAB)
    hf = hf_model(config, attn_implementation)
    assert hf.config._attn_implementation == attn_implementation
    ours = from_hf_state_dict(hf.state_dict(), config).eval()
    batch = batch_factory(VOCAB)
    assert (batch["attention_mask"] == 0).any() and (batch["token_type_ids"] == 1).any()
    with torch.no_grad():
        theirs = hf_outputs(hf, batch)
        full = our_outputs(ours, batch, gathered=False)
        gathered = our_outputs(ours, batch, gathered=True)

    diffs = {
        "mlm_logits": max_abs_diff(full.mlm_logits, theirs.prediction_logits),
        "nsp_logits": max_abs_diff(full.nsp_logits, theirs.seq_relationship_logits),
        "loss(full)": abs(full.loss.item() - theirs.loss.item()),
        "loss(gathered)": abs(gathered.loss.item() - theirs.loss.item()),
    }
    # transformers returns only the sum; its parts from its own logits and labels:
    hf_mlm_loss = F.cross_entropy(theirs.prediction_logits.reshape(-1, VOCAB), batch["full_mlm_labels"].reshape(-1))
    hf_nsp_loss = F.cross_entropy(theirs.seq_relationship_logits, batch["next_sentence_labels"])
    diffs["mlm_loss(gathered)"] = abs(gathered.mlm_loss.item() - hf_mlm_loss.item())
    diffs["nsp_loss"] = abs(gathered.nsp_loss.item() - hf_nsp_loss.item())
    print(f"\n{preset}/{attn_implementation} max abs diffs: {diffs}")
    assert all(diff <= ATOL for diff in diffs.values()), diffs
    # and our gathered MLM loss is the full-sequence one
    assert abs(gathered.mlm_loss.item() - full.mlm_loss.item()) <= 1e-6


@pytest.mark.parametrize("preset", ["tiny", "mini"])
def test_ours_to_hf_parity(preset, batch_factory):
    config = BertConfig.from_preset(preset, vocab_size=VOCAB)
    torch.manual_seed(1)
    ours = BertForPreTraining(config).eval()
    hf_state = to_hf_state_dict(ours)
    hf = hf_model(config, "sdpa", seed=2)
    assert set(hf_state) == set(hf.state_dict())   # exactly transformers' names, tied aliases included
    hf.load_state_dict(hf_state, strict=True)
    assert hf.cls.predictions.decoder.weight is hf.bert.embeddings.word_embeddings.weight   # still tied
    batch = batch_factory(VOCAB, seed=3)
    with torch.no_grad():
        theirs = hf_outputs(hf, batch)
        mine = our_outputs(ours, batch, gathered=False)
    diffs = (max_abs_diff(mine.mlm_logits, theirs.prediction_logits),
             max_abs_diff(mine.nsp_logits, theirs.seq_relationship_logits), abs(mine.loss.item() - theirs.loss.item()))
    print(f"\n{preset} ours->hf max abs diffs (mlm, nsp, loss): {diffs}")
    assert max(diffs) <= ATOL

    # and back again, bit for bit
    again = from_hf_state_dict(hf.state_dict(), config)
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name


def test_config_round_trip():
    config = BertConfig.from_preset("mini", vocab_size=VOCAB, hidden_dropout=0.05, max_position_embeddings=128)
    hf_config = hf_config_from(config)
    assert (hf_config.num_hidden_layers, hf_config.num_attention_heads, hf_config.hidden_act) == (4, 4, "gelu")
    assert config_from_hf(hf_config) == config
    assert config_from_hf(hf_config.to_dict()) == config
    with pytest.raises(ValueError, match="hidden_act='gelu_new'"):
        config_from_hf({**hf_config.to_dict(), "hidden_act": "gelu_new"})


def test_refuses_wrong_or_untied_state_dicts():
    config = BertConfig.from_preset("tiny", vocab_size=VOCAB)
    state = to_hf_state_dict(BertForPreTraining(config))
    with pytest.raises(ValueError, match="missing"):
        from_hf_state_dict(state, BertConfig.from_preset("tiny", vocab_size=VOCAB, num_layers=3))
    untied = {**state, "cls.predictions.decoder.weight": state["cls.predictions.decoder.weight"] + 1}
    with pytest.raises(ValueError, match="not tied"):
        from_hf_state_dict(untied, config)


def test_loads_old_checkpoint_names():
    """bert-base-uncased's pytorch_model.bin: LayerNorm gamma/beta, a position_ids buffer, no tied aliases."""
    config = BertConfig.from_preset("tiny", vocab_size=VOCAB)
    ours = BertForPreTraining(config)
    old = {}
    for name, tensor in to_hf_state_dict(ours).items():
        if name.startswith("cls.predictions.decoder"):
            continue
        if "LayerNorm" in name:
            name = name.replace(".weight", ".gamma").replace(".bias", ".beta")
        old[name] = tensor
    old["bert.embeddings.position_ids"] = torch.arange(512)[None]
    loaded = from_hf_state_dict(old, config)
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name


# ----------------------------------------------------------------------------------------------------------
# export

SPECIALS = ["[PAD]", "[unused0]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
WORDS = ["hello", "world", "the", "cat", "sat", "##s", "on", "mat", ".", ","]


def write_vocab(path, size=VOCAB) -> list[str]:
    tokens = SPECIALS + WORDS
    tokens += [f"w{i}" for i in range(size - len(tokens))]
    path.write_text("".join(token + "\n" for token in tokens), encoding="utf-8")
    return tokens


def test_export_loads_offline_with_identical_logits(tmp_path, batch_factory):
    config = BertConfig.from_preset("tiny", vocab_size=VOCAB)
    torch.manual_seed(0)
    ours = BertForPreTraining(config).eval()
    vocab_file = tmp_path / "my-vocab.txt"
    write_vocab(vocab_file)
    out_dir = export_hf(ours, tmp_path / "export", vocab_file)
    assert json.loads((out_dir / "config.json").read_text())["architectures"] == ["BertForPreTraining"]

    hf, info = transformers.BertForPreTraining.from_pretrained(out_dir, output_loading_info=True,
                                                               local_files_only=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    hf.eval()
    embedding = hf.bert.embeddings.word_embeddings.weight
    assert hf.cls.predictions.decoder.weight.data_ptr() == embedding.data_ptr()   # tied after loading
    assert torch.equal(embedding, ours.bert.embeddings.word_embeddings.weight)
    assert torch.equal(hf.cls.predictions.decoder.bias, ours.mlm_head.decoder.bias)

    batch = batch_factory(VOCAB, seed=5)
    with torch.no_grad():
        theirs = hf_outputs(hf, batch)
        mine = our_outputs(ours, batch, gathered=False)
    assert max_abs_diff(mine.mlm_logits, theirs.prediction_logits) <= ATOL
    assert max_abs_diff(mine.nsp_logits, theirs.seq_relationship_logits) <= ATOL

    # the exported file converts back to the same weights
    from safetensors.torch import load_file
    again = from_hf_state_dict(load_file(out_dir / "model.safetensors"), config)
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name

    tokenizer = transformers.AutoTokenizer.from_pretrained(out_dir, local_files_only=True)
    tokens = write_vocab(tmp_path / "expected.txt")
    ids = tokenizer("Hello cats", "The mat.")["input_ids"]
    assert [tokens[i] for i in ids] == ["[CLS]", "hello", "cat", "##s", "[SEP]", "the", "mat", ".", "[SEP]"]
    assert tokenizer.pad_token_id == 0 and tokenizer.mask_token == "[MASK]"


def test_export_tokenizer_from_a_data_prep_directory(tmp_path):
    """data_prep writes vocab.txt and tokenizer.json beside its shards; export takes the directory."""
    from data_prep.vocab import build_tokenizer

    shards = tmp_path / "shards"
    shards.mkdir()
    tokens = write_vocab(shards / "vocab.txt")
    build_tokenizer(tokens, lowercase=False).save(str(shards / "tokenizer.json"))
    config = BertConfig.from_preset("tiny", vocab_size=VOCAB)
    out_dir = export_hf(BertForPreTraining(config), tmp_path / "export", shards)
    assert json.loads((out_dir / "tokenizer_config.json").read_text())["do_lower_case"] is False
    tokenizer = transformers.AutoTokenizer.from_pretrained(out_dir, local_files_only=True)
    assert [tokens[i] for i in tokenizer("hello Hello")["input_ids"]] == ["[CLS]", "hello", "[UNK]", "[SEP]"]


def test_export_refuses_a_vocabulary_larger_than_the_model(tmp_path):
    config = BertConfig.from_preset("tiny", vocab_size=500)
    write_vocab(tmp_path / "vocab.txt")
    with pytest.raises(ValueError, match="1000 tokens but the model only 500"):
        export_hf(BertForPreTraining(config), tmp_path / "export", tmp_path / "vocab.txt")


@pytest.mark.parametrize("preset", ["tiny", "mini"])
def test_training_gradients_match_hf(preset, batch_factory):
    """One backward in training mode (dropout 0: masks cannot match): the same loss and the same gradients."""
    config = BertConfig.from_preset(preset, vocab_size=VOCAB, hidden_dropout=0.0, attention_dropout=0.0)
    hf = hf_model(config, "sdpa").train()
    ours = from_hf_state_dict(hf.state_dict(), config).train()
    batch = batch_factory(VOCAB)
    theirs = hf_outputs(hf, batch)
    mine = our_outputs(ours, batch, gathered=True)
    theirs.loss.backward()
    mine.loss.backward()
    assert abs(mine.loss.item() - theirs.loss.item()) <= ATOL
    # our gradients under transformers' names: a copy of our model holding them in place of the weights
    grads = copy.deepcopy(ours)
    for holder, param in zip(grads.parameters(), ours.parameters()):
        holder.data = param.grad
    our_grads = to_hf_state_dict(grads)
    diffs = {name: max_abs_diff(our_grads[name], param.grad) for name, param in hf.named_parameters()}
    print(f"\n{preset} largest gradient diff: {max(diffs.items(), key=lambda item: item[1])}")
    assert max(diffs.values()) <= ATOL, diffs
