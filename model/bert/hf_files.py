"""Hugging Face checkpoint directories of BERT, written: export_hf and export_hf_task (config.json, model.safetensors
and the tokenizer, which transformers loads offline). The conversion of names and configs is
model/bert/hf_conversion.py; the weight files are written and read (read_hf_checkpoint: any transformers checkpoint
directory, such as a model downloaded from a hub) by model/shared/hf_checkpoints.py.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from model.bert.config import BertConfig
from model.bert.hf_conversion import (
    HF_TIED_ALIASES,
    TaskModel,
    hf_config_dict,
    hf_task_config_dict,
    task_to_hf_state_dict,
    to_hf_state_dict,
)
from model.bert.model import BertForPreTraining
from model.shared.hf_checkpoints import write_hf_weights

_SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                   "mask_token": "[MASK]"}


def export_hf(model: BertForPreTraining, out_dir: str | Path, tokenizer_dir_or_vocab_file: str | Path | None = None,
              lowercase: bool | None = None) -> Path:
    """Write a directory transformers loads offline: config.json, model.safetensors, and the tokenizer if given.

    ``transformers.BertForPreTraining.from_pretrained(out_dir)`` (BertForMaskedLM for a model without the next-sentence
    head; or BertModel, or AutoModel* for fine-tuning) then gives our model's outputs, and
    ``AutoTokenizer.from_pretrained(out_dir)`` its tokenizer.
    tokenizer_dir_or_vocab_file: a vocab.txt, or a directory holding one (and optionally tokenizer.json), such
    as a data_prep output directory. lowercase: whether the tokenizer lowercases; by default read from
    tokenizer.json when there is one, else True (uncased BERT).
    """
    # The tied aliases are left out, as transformers itself does.
    tensors = {name: tensor for name, tensor in to_hf_state_dict(model).items() if name not in HF_TIED_ALIASES}
    architecture = "BertForPreTraining" if model.next_sentence_prediction else "BertForMaskedLM"
    return _write_hf_dir(out_dir, hf_config_dict(model.config, architecture), tensors, model.config,
                         tokenizer_dir_or_vocab_file, lowercase)


def export_hf_task(model: TaskModel, out_dir: str | Path, tokenizer_dir_or_vocab_file: str | Path | None = None,
                   id2label: Mapping[int | str, str] | Sequence[str] | None = None,
                   lowercase: bool | None = None) -> Path:
    """export_hf for a task model: AutoModelForSequenceClassification / AutoModelForMultipleChoice /
    AutoModelForQuestionAnswering / AutoModelForTokenClassification .from_pretrained(out_dir) load it offline and
    give its logits (question answering: as start_logits and end_logits, our logits[..., 0] and [..., 1]);
    id2label as for hf_task_config_dict."""
    return _write_hf_dir(out_dir, hf_task_config_dict(model, id2label), task_to_hf_state_dict(model), model.config,
                         tokenizer_dir_or_vocab_file, lowercase)


def _write_hf_dir(out_dir: str | Path, config_dict: dict, hf_state: dict[str, torch.Tensor], config: BertConfig,
                  tokenizer_dir_or_vocab_file: str | Path | None, lowercase: bool | None) -> Path:
    out_dir = write_hf_weights(out_dir, config_dict, hf_state)
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


