"""BERT for pre-training and fine-tuning (PyTorch only; transformers is needed only for the optional conversions)."""
from model.bert import IGNORE_INDEX, BertForPreTraining, BertModel, EncoderOutput, PreTrainingOutput
from model.config import PRESETS, BertConfig
from model.flops import PEAK_FLOPS, batch_flops, flops_per_token, mfu, peak_flops_for_device
from model.heads import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    TaskOutput,
)
from model.modernbert import (
    ModernBertConfig,
    ModernBertForMaskedLM,
    ModernBertForMultipleChoice,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
)

__all__ = [
    "IGNORE_INDEX", "PEAK_FLOPS", "PRESETS", "BertConfig", "BertForMultipleChoice", "BertForPreTraining",
    "BertForQuestionAnswering", "BertForSequenceClassification", "BertForTokenClassification", "BertModel",
    "EncoderOutput", "ModernBertConfig", "ModernBertForMaskedLM", "ModernBertForMultipleChoice",
    "ModernBertForQuestionAnswering", "ModernBertForSequenceClassification", "ModernBertForTokenClassification",
    "ModernBertModel", "PreTrainingOutput", "TaskOutput", "batch_flops", "flops_per_token", "mfu",
    "peak_flops_for_device",
]
