import dataclasses

import pytest

from model.bert.config import PRESETS, BertConfig


@pytest.mark.parametrize("name, layers, hidden, heads", [
    ("tiny", 2, 128, 2), ("mini", 4, 256, 4), ("small", 4, 512, 8), ("medium", 8, 512, 8),
    ("base", 12, 768, 12), ("large", 24, 1024, 16),
])
def test_presets_have_the_published_sizes(name, layers, hidden, heads):
    config = BertConfig.from_preset(name)
    assert (config.num_layers, config.hidden_size, config.num_heads) == (layers, hidden, heads)
    assert config.intermediate_size == 4 * hidden
    assert config.head_size == 64
    assert config.vocab_size == 30522
    assert (config.max_position_embeddings, config.type_vocab_size) == (512, 2)
    assert (config.hidden_dropout, config.attention_dropout) == (0.1, 0.1)
    assert (config.layer_norm_eps, config.initializer_range, config.pad_token_id) == (1e-12, 0.02, 0)


def test_preset_overrides():
    config = BertConfig.from_preset("base", vocab_size=32000, hidden_dropout=0.0)
    assert (config.vocab_size, config.hidden_dropout, config.num_layers) == (32000, 0.0, 12)
    # intermediate follows an overridden hidden size unless it is given too
    assert BertConfig.from_preset("tiny", hidden_size=256).intermediate_size == 1024
    assert BertConfig.from_preset("tiny", hidden_size=256, intermediate_size=300).intermediate_size == 300


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown BERT preset 'huge'") as error:
        BertConfig.from_preset("huge")
    for name in PRESETS:
        assert name in str(error.value)


def test_unknown_override_field():
    with pytest.raises(ValueError, match="num_hidden_layers"):
        BertConfig.from_preset("tiny", num_hidden_layers=3)


@pytest.mark.parametrize("overrides, message", [
    ({"hidden_size": 100, "num_heads": 3}, r"hidden_size \(100\) must be divisible by num_heads \(3\)"),
    ({"num_layers": 0}, "num_layers must be a positive integer"),
    ({"vocab_size": 10.5}, "vocab_size must be a positive integer"),
    ({"hidden_dropout": 1.0}, r"hidden_dropout must be in \[0, 1\)"),
    ({"attention_dropout": -0.1}, r"attention_dropout must be in \[0, 1\)"),
    ({"layer_norm_eps": 0.0}, "layer_norm_eps must be > 0"),
    ({"pad_token_id": 1000, "vocab_size": 1000}, "pad_token_id"),
])
def test_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        BertConfig.from_preset("tiny", **overrides)


def test_dict_round_trip_and_immutability():
    config = BertConfig.from_preset("mini", vocab_size=1000)
    assert BertConfig.from_dict(config.to_dict()) == config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.hidden_size = 3
