"""Conversion to and from transformers' BERT models: configs, state dicts, loadable exports, and checkpoints.

Covers BertForPreTraining (ours <-> theirs), any checkpoint's encoder (BertModel, BertForPreTraining, a
fine-tuned model: encoder_state_from_hf), and the fine-tuning heads of model/bert/heads.py (sequence classification,
multiple choice, question answering, token classification), whose classes and head parameters have transformers'
names. Nothing here needs transformers to be installed except hf_config_from (which
builds a transformers.BertConfig). Reading and writing checkpoint directories is model/bert/hf_files.py. The state-dict
names are exactly transformers' (the same as those of the original BERT checkpoints converted to PyTorch), so our
weights load into transformers and back bit for bit.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from model.bert.config import BertConfig
from model.bert.heads import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from model.bert.model import BertForPreTraining
from model.shared.hf_checkpoints import short_list, split_encoder, with_task_labels

# transformers stores the tied decoder twice in state_dict() (as the embedding and as the decoder) and saves it
# once; these are the aliases it drops when saving.
HF_TIED_ALIASES = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
# In state dicts of old checkpoints (bert-base-uncased's pytorch_model.bin): a buffer, not a weight. With the
# prefix in a model holding a BertModel as .bert, without it in a BertModel's own.
_HF_NON_WEIGHTS = {"bert.embeddings.position_ids", "embeddings.position_ids"}
_BERT = "bert."  # where BertForPreTraining and the task models (ours and transformers') keep the encoder
# BertModel(add_pooling_layer=False) and BertForMaskedLM checkpoints have no pooler.
_HF_POOLER = {"pooler.dense.weight", "pooler.dense.bias"}
# transformers' classes with an MLM decoder, the only ones in which tie_word_embeddings means anything to us.
_HF_DECODER_ARCHITECTURES = {"BertForPreTraining", "BertForMaskedLM", "BertLMHeadModel"}
TASK_MODELS = (BertForSequenceClassification, BertForMultipleChoice, BertForQuestionAnswering,
               BertForTokenClassification)
TaskModel = (BertForSequenceClassification | BertForMultipleChoice | BertForQuestionAnswering
             | BertForTokenClassification)


def _encoder_renames(num_layers: int) -> list[tuple[str, str]]:
    """(our BertModel name, transformers' BertModel name) of every encoder tensor but the fused qkv."""
    pairs = [(f"embeddings.{table}.weight",) * 2 for table in
             ("word_embeddings", "position_embeddings", "token_type_embeddings")]
    modules = [
        ("embeddings.layer_norm", "embeddings.LayerNorm"),
        ("pooler.dense", "pooler.dense"),
    ]
    for i in range(num_layers):
        ours, theirs = f"layers.{i}", f"encoder.layer.{i}"
        modules += [
            (f"{ours}.attention.output", f"{theirs}.attention.output.dense"),
            (f"{ours}.attention_norm", f"{theirs}.attention.output.LayerNorm"),
            (f"{ours}.feed_forward.fc_in", f"{theirs}.intermediate.dense"),
            (f"{ours}.feed_forward.fc_out", f"{theirs}.output.dense"),
            (f"{ours}.feed_forward_norm", f"{theirs}.output.LayerNorm"),
        ]
    pairs += [(f"{ours}.{param}", f"{theirs}.{param}") for ours, theirs in modules for param in ("weight", "bias")]
    return pairs


# (our BertForPreTraining name, transformers') of the pre-training heads but the tied decoder weight.
_PRETRAINING_HEAD_RENAMES = [
    (f"{ours}.{param}", f"{theirs}.{param}")
    for ours, theirs in [("mlm_head.dense", "cls.predictions.transform.dense"),
                         ("mlm_head.layer_norm", "cls.predictions.transform.LayerNorm"),
                         ("nsp_head", "cls.seq_relationship")]
    for param in ("weight", "bias")
] + [("mlm_head.decoder.bias", "cls.predictions.bias")]


def _qkv_names(layer: int) -> tuple[str, list[str]]:
    """Our fused projection of a layer and transformers' three, as BertModel names."""
    theirs = f"encoder.layer.{layer}.attention.self"
    return f"layers.{layer}.attention.qkv", [f"{theirs}.query", f"{theirs}.key", f"{theirs}.value"]


def _hf_encoder_names(num_layers: int) -> set[str]:
    """Every tensor name of transformers' BertModel with num_layers layers."""
    names = {theirs for _, theirs in _encoder_renames(num_layers)}
    for layer in range(num_layers):
        names |= {f"{name}.{param}" for name in _qkv_names(layer)[1] for param in ("weight", "bias")}
    return names


def _prefixed(prefix: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {prefix + name: tensor for name, tensor in state.items()}


def _encoder_to_hf(state: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """Our BertModel state dict under transformers' BertModel names (views: q, k, v slice the fused tensor).

    A BertModel built without a pooler (add_pooling_layer=False) gives one without, as transformers' does.
    """
    has_pooler = "pooler.dense.weight" in state
    hf = {theirs: state[mine] for mine, theirs in _encoder_renames(num_layers)
          if has_pooler or not mine.startswith("pooler.")}
    for layer in range(num_layers):
        fused, separate = _qkv_names(layer)
        for param in ("weight", "bias"):
            # Rows [0, C) of the fused projection are the query, then the key, then the value.
            for name, part in zip(separate, state[f"{fused}.{param}"].chunk(3, dim=0)):
                hf[f"{name}.{param}"] = part
    return hf


def _encoder_from_hf(hf: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """The inverse of _encoder_to_hf for a checked, complete encoder; only a pooler may be absent (and stays so)."""
    ours = {mine: hf[theirs] for mine, theirs in _encoder_renames(num_layers) if theirs in hf}
    for layer in range(num_layers):
        fused, separate = _qkv_names(layer)
        for param in ("weight", "bias"):
            ours[f"{fused}.{param}"] = torch.cat([hf[f"{name}.{param}"] for name in separate], dim=0)
    return ours


# ----------------------------------------------------------------------------------------------------------
# configs

def hf_config_dict(config: BertConfig, architecture: str = "BertForPreTraining") -> dict:
    """The config.json transformers writes for a BertForPreTraining (or another architecture) of this config."""
    return {
        "architectures": [architecture],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": "gelu",  # transformers' "gelu" is the exact erf GELU
        "hidden_dropout_prob": config.hidden_dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_token_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }


def hf_config_from(config: BertConfig, **hf_kwargs):
    """A transformers.BertConfig; hf_kwargs go to it as well (e.g. attn_implementation="sdpa")."""
    import transformers

    return transformers.BertConfig(**hf_config_dict(config), **hf_kwargs)


def hf_task_config_dict(model: TaskModel, id2label: Mapping[int | str, str] | Sequence[str] | None = None) -> dict:
    """The config.json transformers writes for a fine-tuned model of our task model's class.

    id2label: label names by id (a mapping with int or str keys, or a sequence in id order); by default
    transformers' LABEL_0, LABEL_1, ... Sequence and token classification always get labels (and sequence
    classification problem_type); multiple choice only when id2label is given (its choices are not labels;
    transformers then assumes 2 and ignores them); question answering never (its two outputs, start and end, are
    transformers' default num_labels of 2), and id2label for it is refused.
    """
    _check_task_model(model)
    values = {**hf_config_dict(model.config), "architectures": [type(model).__name__]}
    kind = {BertForQuestionAnswering: "question_answering", BertForSequenceClassification: "sequence_classification",
            BertForTokenClassification: "token_classification", BertForMultipleChoice: "multiple_choice"}[type(model)]
    return with_task_labels(values, kind, model, id2label)


def config_from_hf(hf_config) -> BertConfig:
    """Our config from a transformers.BertConfig or a config.json dict; refuses what our model cannot be.

    Any BERT's config: pre-trained or fine-tuned (BertForSequenceClassification etc.; their labels are not part of
    BertConfig, see hf_task_config_dict for where they go).
    """
    values = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
    requirements = [
        ("hidden_act", "gelu", "the exact (erf) GELU"),
        ("position_embedding_type", "absolute", "learned absolute positions"),
        ("is_decoder", False, "a bidirectional encoder"),
        ("add_cross_attention", False, "no cross-attention"),
    ]
    architectures = values.get("architectures") or []
    # A model without an MLM decoder has nothing to tie, whatever the flag says (fine-tuned exports may say false).
    if not architectures or _HF_DECODER_ARCHITECTURES.intersection(architectures):
        requirements.append(("tie_word_embeddings", True, "an MLM decoder tied to the word embeddings"))
    for key, expected, meaning in requirements:
        if key in values and values[key] != expected:
            raise ValueError(f"cannot convert: {key}={values[key]!r}, "
                             f"but this model has {meaning} ({key}={expected!r})")
    return BertConfig(
        vocab_size=values["vocab_size"],
        hidden_size=values["hidden_size"],
        num_layers=values["num_hidden_layers"],
        num_heads=values["num_attention_heads"],
        intermediate_size=values["intermediate_size"],
        max_position_embeddings=values.get("max_position_embeddings", 512),
        type_vocab_size=values.get("type_vocab_size", 2),
        hidden_dropout=values.get("hidden_dropout_prob", 0.1),
        attention_dropout=values.get("attention_probs_dropout_prob", 0.1),
        layer_norm_eps=values.get("layer_norm_eps", 1e-12),
        initializer_range=values.get("initializer_range", 0.02),
        pad_token_id=values.get("pad_token_id") or 0,
    )


# ----------------------------------------------------------------------------------------------------------
# state dicts

def to_hf_state_dict(model: BertForPreTraining) -> dict[str, torch.Tensor]:
    """transformers' BertForPreTraining state_dict() (the tied aliases included) from our model; of a model without
    the next-sentence head, BertForMaskedLM's (no cls.seq_relationship, no pooler).

    The tensors share memory with the model (as state_dict() does); clone them to keep a snapshot.
    """
    ours = model.state_dict()
    hf = _prefixed(_BERT, _encoder_to_hf(model.bert.state_dict(), model.config.num_layers))
    hf.update({theirs: ours[mine] for mine, theirs in _PRETRAINING_HEAD_RENAMES if mine in ours})
    for alias, target in HF_TIED_ALIASES.items():
        hf[alias] = hf[target]
    return hf


def _normalised(hf_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # Checkpoints converted from TensorFlow in 2018-2019 name LayerNorm parameters gamma and beta.
    renamed = {}
    for name, tensor in hf_state_dict.items():
        if name in _HF_NON_WEIGHTS:
            continue
        if name.endswith(".gamma"):
            name = name[: -len("gamma")] + "weight"
        elif name.endswith(".beta"):
            name = name[: -len("beta")] + "bias"
        renamed[name] = tensor
    return renamed


def from_hf_state_dict(hf_state_dict: dict[str, torch.Tensor], config: BertConfig) -> BertForPreTraining:
    """Our model holding the weights of a transformers BertForPreTraining state dict (or a checkpoint's); of a
    BertForMaskedLM's (no cls.seq_relationship), a model without the next-sentence head and pooler.

    The tied aliases may be absent (safetensors files store them once); a decoder that is present but differs
    from the word embeddings is refused, since this model can only tie them.
    """
    hf = _normalised(hf_state_dict)
    with_nsp = "cls.seq_relationship.weight" in hf
    expected = {_BERT + name for name in _hf_encoder_names(config.num_layers) if with_nsp or name not in _HF_POOLER}
    expected |= {theirs for _, theirs in _PRETRAINING_HEAD_RENAMES if with_nsp or "seq_relationship" not in theirs}
    missing = sorted(expected - hf.keys())
    unexpected = sorted(hf.keys() - expected - HF_TIED_ALIASES.keys())
    if missing or unexpected:
        raise ValueError(f"not a BertForPreTraining state dict for this config ({config.num_layers} layers): "
                         f"missing {missing[:10]}{'...' if len(missing) > 10 else ''}, "
                         f"unexpected {unexpected[:10]}{'...' if len(unexpected) > 10 else ''}")
    for alias, target in HF_TIED_ALIASES.items():
        if alias in hf and not torch.equal(hf[alias], hf[target]):
            raise ValueError(f"{alias} differs from {target}: this checkpoint is not tied, and this model ties them")

    encoder = {name[len(_BERT):]: tensor for name, tensor in hf.items() if name.startswith(_BERT)}
    ours = _prefixed(_BERT, _encoder_from_hf(encoder, config.num_layers))
    ours.update({mine: hf[theirs] for mine, theirs in _PRETRAINING_HEAD_RENAMES if theirs in hf})
    ours["mlm_head.decoder.weight"] = ours["bert.embeddings.word_embeddings.weight"]

    model = BertForPreTraining(config, next_sentence_prediction=with_nsp)
    model.load_state_dict(ours, strict=True)
    return model


def pretraining_heads_from_hf(hf_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our BertForPreTraining's head tensors (mlm_head.*, nsp_head.*; the decoder weight is tied to the word
    embedding) from the ones a transformers BertForPreTraining state dict holds; absent ones stay absent."""
    hf = _normalised(hf_state_dict)
    return {mine: hf[theirs] for mine, theirs in _PRETRAINING_HEAD_RENAMES if theirs in hf}


def encoder_state_from_hf(hf_state_dict: dict[str, torch.Tensor],
                          num_layers: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Split any transformers BERT state dict into our BertModel's state dict and everything else.

    hf_state_dict: a BertModel's (names without "bert."), or a BertForPreTraining's, BertForMaskedLM's, a
    fine-tuned model's (names with it); LayerNorm gamma/beta and position_ids buffers are handled.
    Returns (encoder, others): encoder is keyed as our BertModel ("layers.0.attention.qkv.weight"), ready for
    BertModel.load_state_dict; it lacks pooler.* when the checkpoint has no pooler (load it with strict=False
    then, or not at all). others holds the remaining tensors under their own names (LayerNorm gamma/beta renamed
    weight/bias), e.g. "classifier.weight" or "cls.predictions.bias".
    Encoder tensors missing, or encoder-like names this many layers do not have, raise ValueError.
    """
    encoder, others = split_encoder(_normalised(hf_state_dict), _hf_encoder_names(num_layers), _BERT,
                                    ("embeddings.", "encoder.", "pooler."), "BERT", num_layers, may_lack=_HF_POOLER)
    return _encoder_from_hf(encoder, num_layers), others


def _check_task_model(model) -> None:
    if not isinstance(model, TASK_MODELS):
        raise TypeError(f"expected one of {[cls.__name__ for cls in TASK_MODELS]}, got {type(model).__name__}")


def task_to_hf_state_dict(model: TaskModel) -> dict[str, torch.Tensor]:
    """transformers' state_dict() of the class of the same name, from our task model.

    The encoder is renamed (without a pooler for question answering and token classification, as transformers');
    the head's parameters already have transformers' names. The tensors share memory with the model (as
    state_dict() does); clone them to keep a snapshot.
    """
    _check_task_model(model)
    hf = _prefixed(_BERT, _encoder_to_hf(model.bert.state_dict(), model.config.num_layers))
    hf.update({name: tensor for name, tensor in model.state_dict().items() if not name.startswith(_BERT)})
    return hf


def load_task_from_hf_state_dict(model: TaskModel, hf_state_dict: dict[str, torch.Tensor]) -> None:
    """Load a transformers state dict of the same class (e.g. a fine-tuned checkpoint's) into our task model.

    Strict: the encoder (with its pooler, for the models that have one) and the head, nothing more or less, in the
    model's shapes; a pooler in the checkpoint of a model without one is the only thing dropped. To start
    fine-tuning from a pre-trained checkpoint instead, load encoder_state_from_hf(...)[0] into model.bert.
    """
    _check_task_model(model)
    encoder, others = encoder_state_from_hf(hf_state_dict, model.config.num_layers)
    if model.bert.pooler is None:
        # Question answering and token classification read no pooled state. transformers' classes have no pooler
        # either, but checkpoints saved before it dropped theirs (add_pooling_layer, 2020) carry an unused one.
        encoder = {name: tensor for name, tensor in encoder.items() if not name.startswith("pooler.")}
    state = {**_prefixed(_BERT, encoder), **others}
    expected = model.state_dict()
    missing, unexpected = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
    if missing or unexpected:
        raise ValueError(f"not a transformers {type(model).__name__} state dict: missing {short_list(missing)}, "
                         f"unexpected {short_list(unexpected)}")
    mismatched = [f"{name} {tuple(state[name].shape)} vs the model's {tuple(tensor.shape)}"
                  for name, tensor in expected.items() if state[name].shape != tensor.shape]
    if mismatched:
        raise ValueError(f"shapes differ (another config, or num_labels?): {short_list(mismatched)}")
    model.load_state_dict(state, strict=True)
