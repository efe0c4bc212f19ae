"""Whether a checkpoint's weights can start a run of another config: the same architecture, differing at most in what
a new phase may change.

A phase that starts from another's weights (`init_from_checkpoint=`: BERT's phase 2 from phase 1, ModernBERT's
context extension from its 1,024-token phase, continued pre-training) builds its model from its own config and loads
every tensor into it. A tensor of another shape fails the load by itself, but several fields change what the model
computes without changing a single shape (the number of heads at the same width, the sliding window, which layers
are global, the LayerNorm epsilon): such weights would load and quietly mean something else. So every field of
either config is classified here, and a field outside the ones a phase may change must be equal:

- ARCHITECTURE: what the weights were learnt as; must be equal.
- CONTEXT_EXTENSION (ModernBERT only): the rotary thetas of each layer kind and the longest sequence. RoPE has no
  learned position table (model/modernbert/model.py computes the angles from the config at every forward), so the
  weights carry over unchanged and the new thetas take effect at the first step. BERT's positions are a learned
  table of max_position_embeddings rows: an architecture field there.
- FREE: what only training, initialisation or a task head reads (dropouts, the initialiser, the classifier's
  pooling), how attention runs, and the special tokens' ids (taken from the shard set's tokenizer, which
  check_init_vocabulary holds to the checkpoint's).

Why a new phase starts from weights only (init_from_checkpoint: a new optimizer, schedule and data position) and not
by resuming (ckpt_path): a resume continues the old run, its step counter, its schedule (a phase 1 trained with a
warmup-stable-decay would carry on decaying), its position in another shard set and its record, which refuses the
new data, sequence length and thetas unless each is accepted. ModernBERT's context extension (Warner et al. 2024)
trains on a new 8,192-token mixture with a schedule of its own (a constant lower rate, then a 1-sqrt decay): a new
optimizer and schedule, as BERT's phase 2. The optimizer's moments are not carried; the new schedule's warmup
rebuilds them.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from model.architectures import EncoderConfig, family_name
from model.bert.config import BertConfig
from model.modernbert.config import ModernBertConfig

ARCHITECTURE: dict[type, tuple[str, ...]] = {
    BertConfig: ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size", "layer_norm_eps"),
    # ModernBERT's context extension kept the 128-token window and the every-third global layer: those stay fixed.
    ModernBertConfig: ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                       "global_attn_every_n_layers", "local_attention", "norm_eps"),
}
CONTEXT_EXTENSION: dict[type, tuple[str, ...]] = {
    BertConfig: (),
    ModernBertConfig: ("max_position_embeddings", "global_rope_theta", "local_rope_theta"),
}
FREE: dict[type, tuple[str, ...]] = {
    BertConfig: ("hidden_dropout", "attention_dropout", "initializer_range", "pad_token_id"),
    ModernBertConfig: ("embedding_dropout", "attention_dropout", "mlp_dropout", "initializer_range",
                       "initializer_cutoff_factor", "pad_token_id", "cls_token_id", "sep_token_id", "mask_token_id",
                       "classifier_pooling", "classifier_dropout", "attention_backend"),
}


def architecture_differences(config: EncoderConfig, checkpoint_config: EncoderConfig) -> dict[str, tuple[Any, Any]]:
    """{field: (the checkpoint's, this run's)} for the architecture fields that differ (same family assumed)."""
    return _differences(config, checkpoint_config, ARCHITECTURE[type(config)])


def context_extension_changes(config: EncoderConfig, checkpoint_config: EncoderConfig
                              ) -> dict[str, tuple[Any, Any]]:
    """{field: (the checkpoint's, this run's)} for the RoPE thetas and the longest sequence, where they differ."""
    return _differences(config, checkpoint_config, CONTEXT_EXTENSION[type(config)])


def check_same_architecture(config: EncoderConfig, checkpoint_config: EncoderConfig, path: str | Path) -> None:
    """Refuses `path`'s weights for a model of `config` where any architecture field differs, naming each one."""
    differences = architecture_differences(config, checkpoint_config)
    if not differences:
        return
    listed = ", ".join(f"{name}={theirs!r} in the checkpoint, {ours!r} in this run"
                       for name, (theirs, ours) in differences.items())
    changeable = CONTEXT_EXTENSION[type(config)]
    may_change = (f"; a phase started from it may change only {', '.join(changeable)} (a context extension)"
                  if changeable else "")
    raise ValueError(f"{path} holds a {family_name(config)} of another architecture: {listed}. Its weights would "
                     f"not mean what they learnt in this model{may_change}. Choose the checkpoint's model (the same "
                     f"model= preset and model.* overrides it was trained with) or start from another checkpoint")


def _differences(config: EncoderConfig, checkpoint_config: EncoderConfig,
                 fields: tuple[str, ...]) -> dict[str, tuple[Any, Any]]:
    return {name: (getattr(checkpoint_config, name), getattr(config, name)) for name in fields
            if getattr(checkpoint_config, name) != getattr(config, name)}


def classified_fields(config_class: type) -> tuple[str, ...]:
    """Every field the three classes above name for a config class (a test holds them to its dataclass fields)."""
    return (*ARCHITECTURE[config_class], *CONTEXT_EXTENSION[config_class], *FREE[config_class])


def config_fields(config_class: type) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(config_class))


def describe_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    """'global_rope_theta 10000.0 -> 160000.0, ...' for the log line of a context extension."""
    return ", ".join(f"{name} {theirs} -> {ours}" for name, (theirs, ours) in changes.items())

