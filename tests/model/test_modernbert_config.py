"""ModernBertConfig: presets, validation, dicts; its transformers config.json both ways and the refusals; FLOPs."""
import json

import pytest

from model import BertConfig, flops_per_token
from model.bert.hf_conversion import hf_config_dict as bert_hf_config_dict
from model.modernbert import PRESETS, ModernBertConfig
from model.modernbert.hf_conversion import config_from_hf, hf_config_dict

VOCAB = 320


def test_presets():
    base = ModernBertConfig.from_preset("modernbert_base")
    assert (base.num_layers, base.hidden_size, base.num_heads, base.intermediate_size) == (22, 768, 12, 1152)
    large = ModernBertConfig.from_preset("modernbert_large", vocab_size=VOCAB)
    assert (large.num_layers, large.hidden_size, large.num_heads, large.intermediate_size) == (28, 1024, 16, 2624)
    assert large.vocab_size == VOCAB and large.head_size == 64
    for name in PRESETS:
        config = ModernBertConfig.from_preset(name)
        kinds = {config.layer_is_global(i) for i in range(config.num_layers)}
        assert kinds == {True, False}, name  # global and local layers in every preset
    assert [base.layer_is_global(i) for i in range(7)] == [True, False, False, True, False, False, True]
    with pytest.raises(ValueError, match="unknown ModernBERT preset 'modernbert_huge'"):
        ModernBertConfig.from_preset("modernbert_huge")
    with pytest.raises(ValueError, match="unknown ModernBertConfig fields"):
        ModernBertConfig.from_preset("modernbert_tiny", hidden_dropout=0.1)


@pytest.mark.parametrize("overrides,message", [
    ({"local_attention": 127}, "local_attention must be even, got 127"),
    ({"local_attention": 0}, "local_attention must be a positive integer"),
    ({"num_heads": 3}, "must be divisible by num_heads"),
    ({"hidden_size": 132, "num_heads": 4}, "head size .* must be even"),
    ({"mask_token_id": VOCAB}, "mask_token_id .* must be a token id below vocab_size"),
    ({"classifier_pooling": "max"}, "classifier_pooling must be one of"),
    ({"attention_backend": "flash"}, "attention_backend must be one of"),
    ({"attention_backend": "flex", "attention_dropout": 0.1}, "flex_attention has none"),
    ({"mlp_dropout": 1.0}, r"mlp_dropout must be in \[0, 1\)"),
    ({"global_rope_theta": 0.0}, "global_rope_theta must be > 0"),
])
def test_refuses_invalid_configs(overrides, message):
    with pytest.raises(ValueError, match=message):
        ModernBertConfig.from_preset("modernbert_tiny", vocab_size=VOCAB, **overrides)


def test_dict_round_trip():
    config = ModernBertConfig.from_preset("modernbert_mini", vocab_size=VOCAB, local_attention=64,
                                          classifier_pooling="mean")
    values = config.to_dict()
    assert values["architecture"] == "modernbert" == ModernBertConfig.architecture
    assert "architecture" not in BertConfig.from_preset("tiny").to_dict()
    assert ModernBertConfig.from_dict(json.loads(json.dumps(values))) == config
    assert ModernBertConfig.from_dict({k: v for k, v in values.items() if k != "architecture"}) == config
    with pytest.raises(ValueError, match="architecture 'bert'"):
        ModernBertConfig.from_dict({**values, "architecture": "bert"})


def test_transformers_reads_our_config_json(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = ModernBertConfig.from_preset("modernbert_tiny", vocab_size=VOCAB, num_layers=5, local_attention=16,
                                          global_attn_every_n_layers=2, global_rope_theta=80000.0,
                                          local_rope_theta=5000.0, mask_token_id=7)
    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(config)))
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    assert hf.model_type == "modernbert"
    assert hf.layer_types == ["full_attention", "sliding_attention"] * 2 + ["full_attention"]
    assert hf.rope_parameters["full_attention"]["rope_theta"] == 80000.0
    assert hf.rope_parameters["sliding_attention"]["rope_theta"] == 5000.0
    assert hf.sliding_window == 8 and hf.local_attention == 16
    assert config_from_hf(hf) == config  # transformers' own to_dict() back
    assert config_from_hf(hf_config_dict(config)) == config


def test_reads_transformers_4_config_keys():
    """Configs on the hub from transformers 4.x: global_attn_every_n_layers and the two rope thetas, no layer_types,
    no mask_token_id (ours then keeps its default)."""
    old = {"model_type": "modernbert", "vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 4,
           "num_attention_heads": 2, "intermediate_size": 96, "global_attn_every_n_layers": 3,
           "global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "local_attention": 128, "norm_bias": False,
           "hidden_activation": "gelu", "pad_token_id": 0, "cls_token_id": 2, "sep_token_id": 3}
    config = config_from_hf(old)
    assert (config.global_attn_every_n_layers, config.local_attention, config.mask_token_id) == (3, 128, 4)


@pytest.mark.parametrize("change,message", [
    ({"norm_bias": True}, "norm_bias=True"),
    ({"hidden_activation": "silu"}, "hidden_activation='silu'"),
    ({"attention_bias": True}, "attention_bias=True"),
    ({"decoder_bias": False}, "decoder_bias=False"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1.0, "factor": 4.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1.0}}}, "rope_type 'yarn'"),
    ({"layer_types": ["sliding_attention", "full_attention", "full_attention"]}, "not every n-th layer global"),
    ({"tie_word_embeddings": False}, "tied to the token embeddings"),
])
def test_refuses_what_we_do_not_implement(change, message):
    config = ModernBertConfig.from_preset("modernbert_tiny", vocab_size=VOCAB)
    with pytest.raises(ValueError, match=message):
        config_from_hf({**hf_config_dict(config), **change})


def test_refuses_a_bert_config():
    bert = bert_hf_config_dict(BertConfig.from_preset("tiny", vocab_size=VOCAB))
    with pytest.raises(ValueError, match="holds a 'bert' model, not ModernBERT"):
        config_from_hf(bert)


def test_flops_per_token():
    config = ModernBertConfig.from_preset("modernbert_tiny", vocab_size=VOCAB)  # 3 layers: 1 global, 2 local
    C, F, V, T, P = 128, 192, VOCAB, 512, 20
    weights = 3 * (4 * C * C + 3 * C * F) + (C * C + C * V) * P / T
    attention = 12 * C * (T + 2 * (128 + 1))
    assert flops_per_token(config, T, P) == pytest.approx(6 * weights + attention)
    short = 12 * C * 3 * 64  # rows shorter than the window: every layer sees all T keys
    assert flops_per_token(config, 64, P) == pytest.approx(6 * (3 * (4 * C * C + 3 * C * F)
                                                                + (C * C + C * V) * P / 64) + short)
    # BERT's count unchanged
    bert = BertConfig.from_preset("base")
    C, F, V, L = 768, 3072, 30522, 12
    expected = 6 * (L * (4 * C * C + 2 * C * F) + (C * C + C * V) * 20 / 128 + (C * C + 2 * C) / 128) + 12 * L * C * 128
    assert flops_per_token(bert, 128, 20) == pytest.approx(expected)
