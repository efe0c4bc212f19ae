"""Two encoders for pre-training and fine-tuning, in PyTorch only (transformers is needed only for the optional
conversions): bert/ (the paper's) and modernbert/ (Warner et al. 2024), each with its heads and conversion beside
it; shared/ holds what both build on; architectures.py picks one by config, flops.py counts the work of either."""
from model.bert.config import PRESETS, BertConfig
from model.bert.heads import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from model.bert.model import BertForPreTraining, BertModel
from model.flops import PEAK_FLOPS, batch_flops, flops_per_token, mfu, peak_flops_for_device
from model.modernbert import (
    ModernBertConfig,
    ModernBertForMaskedLM,
    ModernBertForMultipleChoice,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
)
from model.shared.outputs import IGNORE_INDEX, EncoderOutput, PreTrainingOutput, TaskOutput

__all__ = [
    "IGNORE_INDEX", "PEAK_FLOPS", "PRESETS", "BertConfig", "BertForMultipleChoice", "BertForPreTraining",
    "BertForQuestionAnswering", "BertForSequenceClassification", "BertForTokenClassification", "BertModel",
    "EncoderOutput", "ModernBertConfig", "ModernBertForMaskedLM", "ModernBertForMultipleChoice",
    "ModernBertForQuestionAnswering", "ModernBertForSequenceClassification", "ModernBertForTokenClassification",
    "ModernBertModel", "PreTrainingOutput", "TaskOutput", "batch_flops", "flops_per_token", "mfu",
    "peak_flops_for_device",
]
