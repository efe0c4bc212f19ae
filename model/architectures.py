"""The two encoder families side by side: which one a preset name or a saved config means, and its pre-training model.

BERT (model/bert/model.py) and the ModernBERT-class encoder (model/modernbert/) keep their own configs and classes; the
pipeline reaches them through these few functions, so that a stage never asks "which one is this" twice in two ways.
A config dict names its family under "architecture" (ModernBertConfig.to_dict() writes it; BertConfig's, written
before there were two, has none and means BERT).
"""
from __future__ import annotations

from typing import Any

from model.bert.config import PRESETS as BERT_PRESETS
from model.bert.config import BertConfig
from model.bert.model import BertForPreTraining
from model.modernbert.config import PRESETS as MODERNBERT_PRESETS
from model.modernbert.config import ModernBertConfig
from model.modernbert.model import ModernBertForMaskedLM

EncoderConfig = BertConfig | ModernBertConfig
PretrainingModel = BertForPreTraining | ModernBertForMaskedLM
MODERNBERT = "modernbert"


def preset_names() -> list[str]:
    return [*BERT_PRESETS, *MODERNBERT_PRESETS]


def config_from_preset(name: str, **fields: Any) -> EncoderConfig:
    """A preset of either family (conf/training/model/<name>.yaml), with any field overridden."""
    fields.pop("architecture", None)   # implied by the name
    if name in MODERNBERT_PRESETS:
        return ModernBertConfig.from_preset(name, **fields)
    if name in BERT_PRESETS:
        return BertConfig.from_preset(name, **fields)
    raise ValueError(f"unknown model {name!r}; known models: {', '.join(preset_names())} (conf/training/model/)")


def config_from_dict(fields: dict[str, Any]) -> EncoderConfig:
    """The config a checkpoint's hyper_parameters (model_config) or a run record holds."""
    fields = dict(fields)
    if fields.pop("architecture", None) == MODERNBERT:
        return ModernBertConfig.from_dict(fields)
    return BertConfig.from_dict(fields)


def is_modernbert(config: Any) -> bool:
    return isinstance(config, ModernBertConfig)


def family_name(config: Any) -> str:
    return "ModernBERT" if is_modernbert(config) else "BERT"


def pretraining_model(config: EncoderConfig, next_sentence_prediction: bool) -> PretrainingModel:
    """BERT's BertForPreTraining (with or without NSP), or ModernBERT's masked LM (MLM only, always)."""
    if is_modernbert(config):
        if next_sentence_prediction:
            raise ValueError("ModernBERT trains with masked LM only: its shard set must have objective=mlm "
                             "(packed documents), not BERT's sentence pairs with next-sentence labels")
        return ModernBertForMaskedLM(config)
    return BertForPreTraining(config, next_sentence_prediction=next_sentence_prediction)
