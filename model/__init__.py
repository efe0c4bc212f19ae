"""BERT for pre-training (PyTorch only; transformers is needed for nothing but the optional conversions)."""
from model.bert import (
    PEAK_FLOPS,
    BertForPreTraining,
    BertModel,
    EncoderOutput,
    PreTrainingOutput,
    flops_per_token,
    mfu,
    peak_flops_for_device,
)
from model.config import PRESETS, BertConfig

__all__ = [
    "PEAK_FLOPS", "PRESETS", "BertConfig", "BertForPreTraining", "BertModel", "EncoderOutput", "PreTrainingOutput",
    "flops_per_token", "mfu", "peak_flops_for_device",
]
