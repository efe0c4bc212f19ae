"""Conversion to and from transformers' ModernBERT classes: configs and state dicts.

Inside the encoder our parameter names are transformers' (model/modernbert/model.py), and the heads' are too
(head.*, decoder.*, classifier.*): converting is renaming our `encoder.` prefix to transformers' `model.` and back,
and checking that a state dict is complete. Nothing here needs transformers to be installed except hf_config_from.
Reading and writing checkpoint directories is model/modernbert/hf_files.py (export_modernbert_hf and
read_modernbert_hf can be imported from here as well).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from model.modernbert.config import ModernBertConfig
from model.modernbert.heads import (
    ModernBertForMultipleChoice,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
)
from model.modernbert.model import ModernBertForMaskedLM
from model.shared.hf_checkpoints import short_list, split_encoder, with_task_labels

_OURS, _HF = "encoder.", "model."  # where our models and transformers' keep the encoder
# transformers' state_dict() holds the tied decoder under both names and save_pretrained stores it once.
HF_TIED_ALIASES = {"decoder.weight": "model.embeddings.tok_embeddings.weight"}
_MLM_HEAD = ("head.dense.weight", "head.norm.weight", "decoder.bias")
TASK_MODELS = (ModernBertForSequenceClassification, ModernBertForMultipleChoice, ModernBertForQuestionAnswering,
               ModernBertForTokenClassification)
TaskModel = (ModernBertForSequenceClassification | ModernBertForMultipleChoice | ModernBertForQuestionAnswering
             | ModernBertForTokenClassification)


def encoder_names(num_layers: int) -> list[str]:
    """Every tensor of a ModernBertModel (ours and transformers'), by name."""
    names = ["embeddings.tok_embeddings.weight", "embeddings.norm.weight", "final_norm.weight"]
    for i in range(num_layers):
        names += [f"layers.{i}.{name}.weight" for name in ("attn.Wqkv", "attn.Wo", "mlp_norm", "mlp.Wi", "mlp.Wo")]
        if i > 0:  # layer 0's attention norm is an Identity
            names.append(f"layers.{i}.attn_norm.weight")
    return names


# ----------------------------------------------------------------------------------------------------------
# configs

def hf_config_dict(config: ModernBertConfig, architecture: str = "ModernBertForMaskedLM") -> dict:
    """The config.json of a transformers ModernBERT of this config (transformers 5's keys, layer_types and
    rope_parameters, and the 4.x keys they replaced, which 5 reads only when the new ones are absent)."""
    layer_types = ["full_attention" if config.layer_is_global(i) else "sliding_attention"
                   for i in range(config.num_layers)]
    return {
        "architectures": [architecture],
        "model_type": "modernbert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "hidden_activation": "gelu",  # transformers' "gelu" is the exact erf GELU
        "max_position_embeddings": config.max_position_embeddings,
        "initializer_range": config.initializer_range,
        "initializer_cutoff_factor": config.initializer_cutoff_factor,
        "norm_eps": config.norm_eps,
        "norm_bias": False,
        "pad_token_id": config.pad_token_id,
        "bos_token_id": config.cls_token_id,
        "eos_token_id": config.sep_token_id,
        "cls_token_id": config.cls_token_id,
        "sep_token_id": config.sep_token_id,
        "mask_token_id": config.mask_token_id,  # not transformers'; kept for our reading back
        "attention_bias": False,
        "attention_dropout": config.attention_dropout,
        "layer_types": layer_types,
        "global_attn_every_n_layers": config.global_attn_every_n_layers,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": config.global_rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": config.local_rope_theta},
        },
        "global_rope_theta": config.global_rope_theta,
        "local_rope_theta": config.local_rope_theta,
        "local_attention": config.local_attention,
        "embedding_dropout": config.embedding_dropout,
        "mlp_bias": False,
        "mlp_dropout": config.mlp_dropout,
        "decoder_bias": True,
        "classifier_pooling": config.classifier_pooling,
        "classifier_dropout": config.classifier_dropout,
        "classifier_bias": False,
        "classifier_activation": "gelu",
        "sparse_prediction": False,
        "tie_word_embeddings": True,
    }


def hf_config_from(config: ModernBertConfig, **hf_kwargs):
    """A transformers.ModernBertConfig; hf_kwargs go to it as well (e.g. attn_implementation="sdpa", num_labels)."""
    import transformers

    values = hf_config_dict(config)
    for old_key in ("global_attn_every_n_layers", "global_rope_theta", "local_rope_theta"):
        values.pop(old_key)  # the new keys say the same
    return transformers.ModernBertConfig(**values, **hf_kwargs)


def hf_task_config_dict(model: TaskModel, id2label: Mapping[int | str, str] | Sequence[str] | None = None) -> dict:
    """The config.json of a fine-tuned transformers model of our task model's class; id2label as for the BERT heads'
    (model.bert.hf_conversion.hf_task_config_dict): label names for the classifiers, none for question answering."""
    _check_task_model(model)
    values = {**hf_config_dict(model.config), "architectures": [type(model).__name__]}
    kind = {ModernBertForQuestionAnswering: "question_answering",
            ModernBertForSequenceClassification: "sequence_classification",
            ModernBertForTokenClassification: "token_classification",
            ModernBertForMultipleChoice: "multiple_choice"}[type(model)]
    return with_task_labels(values, kind, model, id2label)


def config_from_hf(hf_config) -> ModernBertConfig:
    """Our config from a transformers ModernBertConfig or a config.json dict (4.x or 5.x keys); refuses what our
    model cannot be (biases, other activations, scaled RoPE, an attention pattern other than every n-th global)."""
    values = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
    model_type = values.get("model_type")
    if model_type != "modernbert":
        raise ValueError(f"cannot convert: this config.json holds a {model_type!r} model, not ModernBERT")
    requirements = [
        ("hidden_activation", "gelu", "the exact (erf) GELU in its MLP"),
        ("classifier_activation", "gelu", "the exact (erf) GELU in its prediction head"),
        ("norm_bias", False, "LayerNorms without bias"),
        ("attention_bias", False, "attention projections without bias"),
        ("mlp_bias", False, "MLP projections without bias"),
        ("classifier_bias", False, "a prediction head without bias"),
        ("decoder_bias", True, "an MLM decoder with a bias"),
        ("rope_scaling", None, "unscaled rotary embeddings"),
    ]
    # A model without an MLM decoder has nothing to tie, whatever the flag says (fine-tuned exports may say false).
    architectures = values.get("architectures") or []
    if not architectures or "ModernBertForMaskedLM" in architectures:
        requirements.append(("tie_word_embeddings", True, "an MLM decoder tied to the token embeddings"))
    for key, expected, meaning in requirements:
        if key in values and values[key] != expected:
            raise ValueError(f"cannot convert: {key}={values[key]!r}, "
                             f"but this model has {meaning} ({key}={expected!r})")
    num_layers = values["num_hidden_layers"]
    head_size = values["hidden_size"] // values["num_attention_heads"]
    if values.get("head_dim") not in (None, head_size):
        raise ValueError(f"cannot convert: head_dim={values['head_dim']}, but this model's heads have hidden_size / "
                         f"num_attention_heads = {head_size} dimensions")
    global_rope_theta, local_rope_theta = _rope_thetas(values)
    # mask_token_id is not transformers': absent, it keeps our default (read_modernbert_hf takes it from the
    # tokenizer when the directory has one).
    optional = {name: values[name] for name in (
        "max_position_embeddings", "local_attention", "norm_eps", "embedding_dropout", "attention_dropout",
        "mlp_dropout", "initializer_range", "initializer_cutoff_factor", "pad_token_id", "cls_token_id",
        "sep_token_id", "mask_token_id", "classifier_pooling", "classifier_dropout") if values.get(name) is not None}
    return ModernBertConfig(
        vocab_size=values["vocab_size"],
        hidden_size=values["hidden_size"],
        num_layers=num_layers,
        num_heads=values["num_attention_heads"],
        intermediate_size=values["intermediate_size"],
        global_attn_every_n_layers=_global_every_n(values, num_layers),
        global_rope_theta=float(global_rope_theta),
        local_rope_theta=float(local_rope_theta),
        **optional,
    )


def _global_every_n(values: dict, num_layers: int) -> int:
    """global_attn_every_n_layers from transformers 5's layer_types (or 4.x's own key); other patterns refused."""
    layer_types = values.get("layer_types")
    stated = values.get("global_attn_every_n_layers")
    if layer_types is None:
        return 3 if stated is None else stated

    def pattern(n: int) -> list[str]:
        return ["full_attention" if i % n == 0 else "sliding_attention" for i in range(num_layers)]

    if stated is not None and list(layer_types) == pattern(stated):
        return stated  # also when the model has fewer layers than n: the same pattern, the same config back
    global_layers = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    n = global_layers[1] if len(global_layers) > 1 else max(num_layers, 1)
    if list(layer_types) != pattern(n):
        raise ValueError(f"cannot convert: layer_types {layer_types} is not every n-th layer global (from layer 0) "
                         "and the others sliding, the only pattern this model has")
    return n


def _rope_thetas(values: dict) -> tuple[float, float]:
    """(global, local) rope theta from rope_parameters (per layer type, or one for both) or 4.x's keys."""
    rope = values.get("rope_parameters")
    if rope is None:
        return values.get("global_rope_theta", 160000.0), values.get("local_rope_theta", 10000.0)
    per_type = rope if "full_attention" in rope or "sliding_attention" in rope else {
        "full_attention": rope, "sliding_attention": rope}
    thetas = []
    for kind, old_key, default in (("full_attention", "global_rope_theta", 160000.0),
                                   ("sliding_attention", "local_rope_theta", 10000.0)):
        params = per_type.get(kind) or {}
        if params.get("rope_type", "default") != "default":
            raise ValueError(f"cannot convert: rope_parameters[{kind!r}] has rope_type {params['rope_type']!r}, "
                             "but this model has the default (unscaled) rotary embeddings")
        thetas.append(params.get("rope_theta", values.get(old_key, default)))
    return thetas[0], thetas[1]


# ----------------------------------------------------------------------------------------------------------
# state dicts

def _renamed(state: Mapping[str, torch.Tensor], old: str, new: str) -> dict[str, torch.Tensor]:
    return {(new + name[len(old):] if name.startswith(old) else name): tensor for name, tensor in state.items()}


def to_hf_state_dict(model: ModernBertForMaskedLM) -> dict[str, torch.Tensor]:
    """transformers' ModernBertForMaskedLM state_dict() (the tied alias included) from ours; shares memory with it."""
    if not isinstance(model, ModernBertForMaskedLM):
        raise TypeError(f"expected a ModernBertForMaskedLM, got {type(model).__name__}")
    return _renamed(model.state_dict(), _OURS, _HF)


def _check_names(state: Mapping[str, torch.Tensor], expected: set[str], what: str,
                 may_lack: set[str] = frozenset()) -> None:
    missing, unexpected = sorted(expected - state.keys() - may_lack), sorted(state.keys() - expected)
    if missing or unexpected:
        raise ValueError(f"not a {what} state dict: missing {short_list(missing)}, unexpected {short_list(unexpected)}")


def mlm_state_from_hf(hf_state_dict: Mapping[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """Our ModernBertForMaskedLM state dict (for load_state_dict, strict) from transformers' (a state_dict() or a
    safetensors file's, which lacks the tied alias). A decoder that differs from the embeddings is refused."""
    expected = {_HF + name for name in encoder_names(num_layers)} | set(_MLM_HEAD) | set(HF_TIED_ALIASES)
    _check_names(hf_state_dict, expected, f"{num_layers}-layer ModernBertForMaskedLM", set(HF_TIED_ALIASES))
    for alias, target in HF_TIED_ALIASES.items():
        if alias in hf_state_dict and not torch.equal(hf_state_dict[alias], hf_state_dict[target]):
            raise ValueError(f"{alias} differs from {target}: this checkpoint is not tied, and this model ties them")
    ours = _renamed(hf_state_dict, _HF, _OURS)
    ours["decoder.weight"] = ours["encoder.embeddings.tok_embeddings.weight"]
    return ours


def from_hf_state_dict(hf_state_dict: Mapping[str, torch.Tensor], config: ModernBertConfig) -> ModernBertForMaskedLM:
    """Our ModernBertForMaskedLM holding the weights of a transformers ModernBertForMaskedLM state dict."""
    model = ModernBertForMaskedLM(config)
    model.load_state_dict(mlm_state_from_hf(hf_state_dict, config.num_layers), strict=True)
    return model


def encoder_state_from_hf(hf_state_dict: Mapping[str, torch.Tensor],
                          num_layers: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Split any transformers ModernBERT state dict (a ModernBertModel's, without prefix, or a ModernBertForMaskedLM's
    or task model's, with "model.") into our ModernBertModel's state dict and the rest (head.*, decoder.*,
    classifier.*, under their own names). Missing encoder tensors or extra layers raise ValueError."""
    return split_encoder(hf_state_dict, set(encoder_names(num_layers)), _HF, ("embeddings.", "layers.", "final_norm."),
                         "ModernBERT", num_layers)


def _check_task_model(model) -> None:
    if not isinstance(model, TASK_MODELS):
        raise TypeError(f"expected one of {[cls.__name__ for cls in TASK_MODELS]}, got {type(model).__name__}")


def task_to_hf_state_dict(model: TaskModel) -> dict[str, torch.Tensor]:
    """transformers' state_dict() of the class of the same name, from our task model; shares memory with it."""
    _check_task_model(model)
    return _renamed(model.state_dict(), _OURS, _HF)


def load_task_from_hf_state_dict(model: TaskModel, hf_state_dict: Mapping[str, torch.Tensor]) -> None:
    """Load a transformers state dict of the same class (a fine-tuned checkpoint's) into our task model, strictly.
    To start fine-tuning from a pre-trained checkpoint instead, load encoder_state_from_hf(...)[0] into
    model.encoder."""
    _check_task_model(model)
    state = _renamed(hf_state_dict, _HF, _OURS)
    expected = model.state_dict()
    _check_names(state, set(expected), f"transformers {type(model).__name__}")
    mismatched = [f"{name} {tuple(state[name].shape)} vs the model's {tuple(tensor.shape)}"
                  for name, tensor in expected.items() if state[name].shape != tensor.shape]
    if mismatched:
        raise ValueError(f"shapes differ (another config, or num_labels?): {short_list(mismatched)}")
    model.load_state_dict(state, strict=True)


def __getattr__(name: str):
    """export_modernbert_hf and read_modernbert_hf live in model/modernbert/hf_files.py (which imports this module);
    they are reachable from here too, imported on first use."""
    if name in ("export_modernbert_hf", "read_modernbert_hf"):
        from model.modernbert import hf_files

        return getattr(hf_files, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
