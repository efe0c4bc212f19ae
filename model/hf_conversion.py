"""Conversion to and from transformers' BertForPreTraining: configs, state dicts, and a loadable export.

Nothing here needs transformers to be installed except hf_config_from (which builds a transformers.BertConfig);
export_hf needs only safetensors. The state-dict names are exactly transformers' (the same as those of the
original BERT checkpoints converted to PyTorch), so our weights load into transformers and back bit for bit.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from model.bert import BertForPreTraining
from model.config import BertConfig

# transformers stores the tied decoder twice in state_dict() (as the embedding and as the decoder) and saves it
# once; these are the aliases it drops when saving.
HF_TIED_ALIASES = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
# In state dicts of old checkpoints (bert-base-uncased's pytorch_model.bin): a buffer, not a weight.
_HF_NON_WEIGHTS = {"bert.embeddings.position_ids"}


def _renames(num_layers: int) -> list[tuple[str, str]]:
    """(our name, transformers' name) of every tensor but the fused qkv and the tied decoder."""
    pairs = [
        ("bert.embeddings.word_embeddings.weight", "bert.embeddings.word_embeddings.weight"),
        ("bert.embeddings.position_embeddings.weight", "bert.embeddings.position_embeddings.weight"),
        ("bert.embeddings.token_type_embeddings.weight", "bert.embeddings.token_type_embeddings.weight"),
    ]
    modules = [
        ("bert.embeddings.layer_norm", "bert.embeddings.LayerNorm"),
        ("bert.pooler.dense", "bert.pooler.dense"),
        ("mlm_head.dense", "cls.predictions.transform.dense"),
        ("mlm_head.layer_norm", "cls.predictions.transform.LayerNorm"),
        ("nsp_head", "cls.seq_relationship"),
    ]
    for i in range(num_layers):
        ours, theirs = f"bert.layers.{i}", f"bert.encoder.layer.{i}"
        modules += [
            (f"{ours}.attention.output", f"{theirs}.attention.output.dense"),
            (f"{ours}.attention_norm", f"{theirs}.attention.output.LayerNorm"),
            (f"{ours}.feed_forward.fc_in", f"{theirs}.intermediate.dense"),
            (f"{ours}.feed_forward.fc_out", f"{theirs}.output.dense"),
            (f"{ours}.feed_forward_norm", f"{theirs}.output.LayerNorm"),
        ]
    pairs += [(f"{ours}.{param}", f"{theirs}.{param}") for ours, theirs in modules for param in ("weight", "bias")]
    pairs.append(("mlm_head.decoder.bias", "cls.predictions.bias"))
    return pairs


def _qkv_names(layer: int) -> tuple[str, list[str]]:
    theirs = f"bert.encoder.layer.{layer}.attention.self"
    return f"bert.layers.{layer}.attention.qkv", [f"{theirs}.query", f"{theirs}.key", f"{theirs}.value"]


# ----------------------------------------------------------------------------------------------------------
# configs

def hf_config_dict(config: BertConfig) -> dict:
    """The config.json transformers writes for a BertForPreTraining of this config."""
    return {
        "architectures": ["BertForPreTraining"],
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


def config_from_hf(hf_config) -> BertConfig:
    """Our config from a transformers.BertConfig or a config.json dict; refuses what our model cannot be."""
    values = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
    requirements = [
        ("hidden_act", "gelu", "the exact (erf) GELU"),
        ("position_embedding_type", "absolute", "learned absolute positions"),
        ("is_decoder", False, "a bidirectional encoder"),
        ("add_cross_attention", False, "no cross-attention"),
        ("tie_word_embeddings", True, "an MLM decoder tied to the word embeddings"),
    ]
    for key, expected, meaning in requirements:
        if key in values and values[key] != expected:
            raise ValueError(f"cannot convert: {key}={values[key]!r}, but this model has {meaning} ({key}={expected!r})")
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
    """transformers' BertForPreTraining state_dict() (the tied aliases included) from our model.

    The tensors share memory with the model (as state_dict() does); clone them to keep a snapshot.
    """
    ours = model.state_dict()
    hf = {theirs: ours[mine] for mine, theirs in _renames(model.config.num_layers)}
    for layer in range(model.config.num_layers):
        fused, separate = _qkv_names(layer)
        for param in ("weight", "bias"):
            # Rows [0, C) of the fused projection are the query, then the key, then the value.
            for name, part in zip(separate, ours[f"{fused}.{param}"].chunk(3, dim=0)):
                hf[f"{name}.{param}"] = part
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
    """Our model holding the weights of a transformers BertForPreTraining state dict (or a checkpoint's).

    The tied aliases may be absent (safetensors files store them once); a decoder that is present but differs
    from the word embeddings is refused, since this model can only tie them.
    """
    hf = _normalised(hf_state_dict)
    expected = {theirs for _, theirs in _renames(config.num_layers)}
    for layer in range(config.num_layers):
        expected |= {f"{name}.{param}" for name in _qkv_names(layer)[1] for param in ("weight", "bias")}
    missing = sorted(expected - hf.keys())
    unexpected = sorted(hf.keys() - expected - HF_TIED_ALIASES.keys())
    if missing or unexpected:
        raise ValueError(f"not a BertForPreTraining state dict for this config ({config.num_layers} layers): "
                         f"missing {missing[:10]}{'...' if len(missing) > 10 else ''}, "
                         f"unexpected {unexpected[:10]}{'...' if len(unexpected) > 10 else ''}")
    for alias, target in HF_TIED_ALIASES.items():
        if alias in hf and not torch.equal(hf[alias], hf[target]):
            raise ValueError(f"{alias} differs from {target}: this checkpoint is not tied, and this model ties them")

    ours = {mine: hf[theirs] for mine, theirs in _renames(config.num_layers)}
    for layer in range(config.num_layers):
        fused, separate = _qkv_names(layer)
        for param in ("weight", "bias"):
            ours[f"{fused}.{param}"] = torch.cat([hf[f"{name}.{param}"] for name in separate], dim=0)
    ours["mlm_head.decoder.weight"] = ours["bert.embeddings.word_embeddings.weight"]

    model = BertForPreTraining(config)
    model.load_state_dict(ours, strict=True)
    return model


# ----------------------------------------------------------------------------------------------------------
# export

_SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                   "mask_token": "[MASK]"}


def export_hf(model: BertForPreTraining, out_dir: str | Path, tokenizer_dir_or_vocab_file: str | Path | None = None,
              lowercase: bool | None = None) -> Path:
    """Write a directory transformers loads offline: config.json, model.safetensors, and the tokenizer if given.

    ``transformers.BertForPreTraining.from_pretrained(out_dir)`` (or BertModel, or AutoModel* for fine-tuning)
    then gives our model's outputs, and ``AutoTokenizer.from_pretrained(out_dir)`` its tokenizer.
    tokenizer_dir_or_vocab_file: a vocab.txt, or a directory holding one (and optionally tokenizer.json), such
    as a data_prep output directory. lowercase: whether the tokenizer lowercases; by default read from
    tokenizer.json when there is one, else True (uncased BERT).
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = model.config
    (out_dir / "config.json").write_text(json.dumps(hf_config_dict(config), indent=2) + "\n", encoding="utf-8")
    # Own contiguous CPU copies: safetensors refuses tensors that share memory (the q, k, v views of one
    # fused weight), and the tied aliases are left out as transformers itself does.
    tensors = {name: tensor.detach().to("cpu", copy=True).contiguous()
               for name, tensor in to_hf_state_dict(model).items() if name not in HF_TIED_ALIASES}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer_dir_or_vocab_file is not None:
        _export_tokenizer(Path(tokenizer_dir_or_vocab_file), out_dir, config, lowercase)
    return out_dir


def _export_tokenizer(source: Path, out_dir: Path, config: BertConfig, lowercase: bool | None) -> None:
    vocab_file = source / "vocab.txt" if source.is_dir() else source
    if not vocab_file.is_file():
        raise FileNotFoundError(f"no vocabulary at {vocab_file}")
    tokens = vocab_file.read_text(encoding="utf-8").splitlines()
    while tokens and tokens[-1] == "":
        tokens.pop()
    # The embedding may be larger than the vocabulary (padded to a multiple of 64 for speed), never smaller.
    if len(tokens) > config.vocab_size:
        raise ValueError(f"{vocab_file} has {len(tokens)} tokens but the model only {config.vocab_size} embeddings")
    missing = [token for token in _SPECIAL_TOKENS.values() if token not in tokens]
    if missing:
        raise ValueError(f"{vocab_file} lacks the special tokens {missing}")
    if tokens[config.pad_token_id] != "[PAD]":
        raise ValueError(f"token {config.pad_token_id} (pad_token_id) of {vocab_file} is "
                         f"{tokens[config.pad_token_id]!r}, not '[PAD]'")
    shutil.copyfile(vocab_file, out_dir / "vocab.txt")

    tokenizer_json = source / "tokenizer.json" if source.is_dir() else None
    if tokenizer_json is not None and tokenizer_json.is_file():
        shutil.copyfile(tokenizer_json, out_dir / "tokenizer.json")
        if lowercase is None:
            normalizer = json.loads(tokenizer_json.read_text(encoding="utf-8")).get("normalizer") or {}
            lowercase = bool(normalizer.get("lowercase", True))
    if lowercase is None:
        lowercase = True
    tokenizer_config = {"tokenizer_class": "BertTokenizer", "do_lower_case": lowercase,
                        "model_max_length": config.max_position_embeddings, **_SPECIAL_TOKENS}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
