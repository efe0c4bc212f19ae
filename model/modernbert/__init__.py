"""A ModernBERT-class encoder (Warner et al. 2024), equal to transformers' ModernBERT classes: config, encoder,
masked-LM model, fine-tuning heads, and conversion to and from transformers."""
from model.modernbert.config import PRESETS, ModernBertConfig
from model.modernbert.heads import (
    ModernBertForMultipleChoice,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
)
from model.modernbert.model import ModernBertForMaskedLM, ModernBertModel

__all__ = [
    "PRESETS", "ModernBertConfig", "ModernBertForMaskedLM", "ModernBertForMultipleChoice",
    "ModernBertForQuestionAnswering", "ModernBertForSequenceClassification", "ModernBertForTokenClassification",
    "ModernBertModel",
]
