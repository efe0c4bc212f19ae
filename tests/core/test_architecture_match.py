"""Which config differences a checkpoint may start a run with: ModernBERT's context extension (RoPE thetas, the
longest sequence) passes; every architecture field, including those that change no tensor's shape, is refused by
name, before any weight is loaded."""
from __future__ import annotations

import dataclasses

import pytest

from model.bert.config import BertConfig
from model.modernbert.config import ModernBertConfig
from pipeline.core.checkpoints.architecture_match import (
    check_same_architecture,
    classified_fields,
    config_fields,
    context_extension_changes,
)


@pytest.mark.parametrize("config_class", [BertConfig, ModernBertConfig])
def test_every_config_field_is_classified_once(config_class):
    """A new config field must be put in one class (architecture, context extension, free) before it ships."""
    classified = classified_fields(config_class)
    assert sorted(classified) == sorted(config_fields(config_class))
    assert len(set(classified)) == len(classified)


PHASE_1 = ModernBertConfig.from_preset("modernbert_tiny", vocab_size=30522, max_position_embeddings=1024,
                                       global_rope_theta=10000.0)


def test_a_context_extension_is_accepted_and_its_changes_named():
    extended = dataclasses.replace(PHASE_1, max_position_embeddings=8192, global_rope_theta=160000.0,
                                   attention_backend="sdpa", attention_dropout=0.1, pad_token_id=3)
    check_same_architecture(extended, PHASE_1, "phase1.ckpt")
    assert context_extension_changes(extended, PHASE_1) == {"max_position_embeddings": (1024, 8192),
                                                            "global_rope_theta": (10000.0, 160000.0)}


@pytest.mark.parametrize("field, value", [("hidden_size", 256), ("num_layers", 6), ("vocab_size", 32000),
                                          ("intermediate_size", 384),
                                          # the same shapes, another model: these would load silently
                                          ("num_heads", 4), ("local_attention", 256),
                                          ("global_attn_every_n_layers", 2), ("norm_eps", 1e-6)])
def test_another_modernbert_architecture_is_refused_naming_the_field(field, value):
    other = dataclasses.replace(PHASE_1, **{field: value})
    with pytest.raises(ValueError, match=rf"phase1.ckpt holds a ModernBERT of another architecture: {field}="
                                         rf".* in the checkpoint, {value!r} in this run.*may change only "
                                         "max_position_embeddings, global_rope_theta, local_rope_theta"):
        check_same_architecture(other, PHASE_1, "phase1.ckpt")


def test_bert_positions_are_a_learned_table_not_a_context_extension():
    phase_1 = BertConfig.from_preset("tiny", vocab_size=30522, max_position_embeddings=128)
    longer = dataclasses.replace(phase_1, max_position_embeddings=512)
    with pytest.raises(ValueError, match=r"another architecture: max_position_embeddings=128 in the checkpoint, "
                                         r"512 in this run\. Its weights"):
        check_same_architecture(longer, phase_1, "bert.ckpt")
    check_same_architecture(dataclasses.replace(phase_1, hidden_dropout=0.0), phase_1, "bert.ckpt")
