"""transformers ModernBERT directories: written (export_modernbert_hf: config.json, model.safetensors and the
tokenizer, which transformers loads offline) and read (read_modernbert_hf). The names and configs are
model/modernbert/hf_conversion.py; the weight files are written and read by model/shared/hf_checkpoints.py.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from model.modernbert.config import ModernBertConfig
from model.modernbert.hf_conversion import (
    HF_TIED_ALIASES,
    TaskModel,
    config_from_hf,
    encoder_state_from_hf,
    hf_config_dict,
    hf_task_config_dict,
    mlm_state_from_hf,
    task_to_hf_state_dict,
    to_hf_state_dict,
)
from model.modernbert.model import ModernBertForMaskedLM
from model.shared.hf_checkpoints import read_hf_checkpoint, write_hf_weights

# transformers' names of the special tokens, and the config field holding each one's id.
_SPECIAL_TOKEN_IDS = {"pad_token": "pad_token_id", "cls_token": "cls_token_id", "sep_token": "sep_token_id",
                      "mask_token": "mask_token_id"}
_MASK_TOKENS = ("[MASK]", "<mask>")  # how tokenizers spell it, to find mask_token_id where config.json has none


def export_modernbert_hf(model: ModernBertForMaskedLM | TaskModel, out_dir: str | Path,
                         tokenizer_dir: str | Path | None = None,
                         id2label: Mapping[int | str, str] | Sequence[str] | None = None) -> Path:
    """Write a directory transformers loads offline: config.json, model.safetensors, and the tokenizer if given.

    A ModernBertForMaskedLM loads with AutoModelForMaskedLM (or AutoModel, the encoder), a task model with its
    AutoModelFor* class (id2label: its label names, as for hf_task_config_dict), and give our logits.
    tokenizer_dir: a directory holding tokenizer.json (a data-prep output directory), or that file; it must hold
    the config's special tokens at their ids. AutoTokenizer.from_pretrained(out_dir) then loads it.
    """
    if isinstance(model, ModernBertForMaskedLM):
        if id2label is not None:
            raise ValueError("id2label given for a masked-LM model, which has no labels")
        config_dict = hf_config_dict(model.config, "ModernBertForMaskedLM")
        # The tied alias is left out, as transformers itself does.
        hf_state = {name: tensor for name, tensor in to_hf_state_dict(model).items() if name not in HF_TIED_ALIASES}
    else:
        config_dict, hf_state = hf_task_config_dict(model, id2label), task_to_hf_state_dict(model)
    out_dir = write_hf_weights(out_dir, config_dict, hf_state)
    if tokenizer_dir is not None:
        export_tokenizer(Path(tokenizer_dir), out_dir, model.config)
    return out_dir


def _tokenizer_json(source: Path) -> Path:
    path = source / "tokenizer.json" if source.is_dir() else source
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {path}")
    return path


def _tokens_by_id(tokenizer: dict) -> dict[int, str]:
    """Every token of a tokenizer.json by id: its model's vocabulary (a mapping, or Unigram's list of pairs) and the
    added tokens."""
    vocab = tokenizer["model"].get("vocab") or {}
    by_id = ({i: entry[0] for i, entry in enumerate(vocab)} if isinstance(vocab, list)
             else {i: token for token, i in vocab.items()})
    by_id.update({added["id"]: added["content"] for added in tokenizer.get("added_tokens") or []})
    return by_id


def export_tokenizer(source: Path, out_dir: Path, config: ModernBertConfig) -> None:
    """Copy tokenizer.json, and write the tokenizer_config.json and special_tokens_map.json that make it a
    PreTrainedTokenizerFast with the config's special tokens."""
    tokenizer_json = _tokenizer_json(source)
    tokenizer = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    by_id = _tokens_by_id(tokenizer)
    special_ids = {added["id"] for added in tokenizer.get("added_tokens") or [] if added.get("special")}
    # The embedding may be larger than the vocabulary (padded to a multiple of 64 for speed), never smaller.
    if max(by_id) >= config.vocab_size:
        raise ValueError(f"{tokenizer_json} has token ids up to {max(by_id)} but the model only {config.vocab_size} "
                         "embeddings")
    special = {}
    for name, field in _SPECIAL_TOKEN_IDS.items():
        token_id = getattr(config, field)
        if token_id not in special_ids:
            raise ValueError(f"token {token_id} ({field}) of {tokenizer_json} is {by_id.get(token_id)!r}, not one of "
                             f"its special tokens {sorted(by_id[i] for i in special_ids)}")
        special[name] = by_id[token_id]
    if "[UNK]" in by_id.values():
        special["unk_token"] = "[UNK]"
    shutil.copyfile(tokenizer_json, out_dir / "tokenizer.json")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": config.max_position_embeddings,
        # Decoding gives the text back: no "cleaning" of spaces before punctuation (a WordPiece-era heuristic).
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],  # no token_type_ids: ModernBERT has no segments
        **special,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")


def _mask_token_id(directory: Path) -> int | None:
    path = directory / "tokenizer.json"
    if not path.is_file():
        return None
    by_token = {token: i for i, token in _tokens_by_id(json.loads(path.read_text(encoding="utf-8"))).items()}
    return next((by_token[token] for token in _MASK_TOKENS if token in by_token), None)


def read_modernbert_hf(directory: str | Path) -> tuple[ModernBertConfig, dict[str, torch.Tensor]]:
    """(config, state dict) of a transformers ModernBERT directory (save_pretrained's, or ours).

    Of a ModernBertForMaskedLM: our ModernBertForMaskedLM's state dict; of a ModernBertModel or a task model: our
    ModernBertModel's (the encoder; a task model's head is for load_task_from_hf_state_dict). mask_token_id, which
    transformers' config.json lacks, comes from the directory's tokenizer.json where it has a [MASK] or <mask>.
    """
    directory = Path(directory)
    hf_config, hf_state = read_hf_checkpoint(directory)
    config = config_from_hf(hf_config)
    if "mask_token_id" not in hf_config and (mask_id := _mask_token_id(directory)) is not None:
        config = dataclasses.replace(config, mask_token_id=mask_id)
    if "decoder.bias" in hf_state or "ModernBertForMaskedLM" in (hf_config.get("architectures") or []):
        return config, mlm_state_from_hf(hf_state, config.num_layers)
    return config, encoder_state_from_hf(hf_state, config.num_layers)[0]
