"""Fine-tuning heads on ModernBertModel: sequence classification or regression, multiple choice, question answering
(answer span), and token classification.

Each is transformers' class of the same name: the encoder, the prediction head (dense + GELU + LayerNorm, as before
the MLM decoder), dropout, and a linear classifier. The sequence-level heads pool the final states first, by the
[CLS] state or by the mean over real tokens (config.classifier_pooling): on long inputs [CLS] sees the whole sequence
only in the global layers. Their forward has the BERT heads' signature (model/bert/heads.py), token_type_ids accepted
and ignored, and they return the same TaskOutput with the same losses.

Shapes: B batch, K choices per example, T sequence length, C hidden size, L num_labels.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from model.modernbert.config import ModernBertConfig
from model.modernbert.model import ModernBertModel, PredictionHead, truncated_normal_
from model.shared.dropout import dropout
from model.shared.losses import choice_loss, mean_cross_entropy, regression_loss, span_loss
from model.shared.outputs import IGNORE_INDEX, TaskOutput, _check_num_labels


def mean_pool(sequence: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(B, T, C) -> (B, C): the mean over each row's real tokens (all T without a mask), as transformers'."""
    if attention_mask is None:
        return sequence.mean(dim=1)
    weights = attention_mask.to(sequence.dtype).unsqueeze(-1)  # (B, T, 1)
    return (sequence * weights).sum(dim=1) / weights.sum(dim=1)


class _ModernBertTask(nn.Module):
    """The encoder, the prediction head, dropout and a classifier of num_outputs scores, initialised as
    transformers' (the classifier with std hidden_size^-0.5, its bias 0)."""

    def __init__(self, config: ModernBertConfig, num_outputs: int):
        super().__init__()
        self.config = config
        self.encoder = ModernBertModel(config)
        self.head = PredictionHead(config)
        self.classifier = nn.Linear(config.hidden_size, num_outputs)
        truncated_normal_(self.classifier.weight, config.hidden_size ** -0.5, config.initializer_cutoff_factor)
        nn.init.zeros_(self.classifier.bias)
        self.dropout_p = config.classifier_dropout

    def scores(self, states: torch.Tensor) -> torch.Tensor:
        """(..., C) -> (..., num_outputs)."""
        return self.classifier(dropout(self.head(states), self.dropout_p, self.training))


class ModernBertForSequenceClassification(_ModernBertTask):
    """Pooled final states to num_labels scores; num_labels == 1 is regression (STS-B), trained with MSE."""

    def __init__(self, config: ModernBertConfig, num_labels: int):
        _check_num_labels(num_labels, " (1 for regression)")
        super().__init__(config, num_labels)
        self.num_labels = num_labels

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """input_ids, attention_mask: (B, T); token_type_ids ignored (ModernBERT has no segments). labels: (B,)
        class ids, or targets (used as float) for regression."""
        sequence = self.encoder(input_ids, attention_mask).sequence_output  # (B, T, C)
        pooled = sequence[:, 0] if self.config.classifier_pooling == "cls" else mean_pool(sequence, attention_mask)
        logits = self.scores(pooled)  # (B, L)
        loss = None
        if labels is not None:
            loss = regression_loss(logits, labels) if self.is_regression else choice_loss(logits, labels)
        return TaskOutput(logits=logits, loss=loss)


class ModernBertForMultipleChoice(_ModernBertTask):
    """Every (context, choice) pair encoded on its own, pooled, and scored by one unit; softmax over the choices."""

    def __init__(self, config: ModernBertConfig):
        super().__init__(config, 1)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """input_ids, attention_mask: (B, K, T); token_type_ids ignored; labels: (B,) index of the right choice."""
        B, K, T = input_ids.shape
        # The K pairs of an example are independent sequences to the encoder: fold them into the batch.
        input_ids = input_ids.reshape(B * K, T)
        attention_mask = None if attention_mask is None else attention_mask.reshape(B * K, T)
        sequence = self.encoder(input_ids, attention_mask).sequence_output  # (B * K, T, C)
        if self.config.classifier_pooling == "cls":
            # [CLS] is the first real token, also under left padding (transformers' rule).
            first = (torch.zeros(B * K, dtype=torch.long, device=input_ids.device) if attention_mask is None
                     else attention_mask.argmax(dim=-1))  # (B * K,)
            pooled = sequence[torch.arange(B * K, device=input_ids.device), first]  # (B * K, C)
        else:
            pooled = mean_pool(sequence, attention_mask)
        logits = self.scores(pooled).view(B, K)
        return TaskOutput(logits=logits, loss=None if labels is None else choice_loss(logits, labels))


class ModernBertForQuestionAnswering(_ModernBertTask):
    """Every token's final state scored as the answer's start and its end."""

    def __init__(self, config: ModernBertConfig):
        super().__init__(config, 2)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """input_ids, attention_mask: (B, T); token_type_ids ignored; labels: (B, 2) the answer's start and end
        token positions (model.shared.losses.span_loss)."""
        sequence = self.encoder(input_ids, attention_mask).sequence_output  # (B, T, C)
        logits = self.scores(sequence)  # (B, T, 2): [..., 0] start, [..., 1] end
        return TaskOutput(logits=logits, loss=None if labels is None else span_loss(logits, labels))


class ModernBertForTokenClassification(_ModernBertTask):
    """Every token's final state to num_labels scores (NER); tokens labelled IGNORE_INDEX take no part in the loss."""

    def __init__(self, config: ModernBertConfig, num_labels: int):
        _check_num_labels(num_labels)
        super().__init__(config, num_labels)
        self.num_labels = num_labels

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """input_ids, attention_mask: (B, T); token_type_ids ignored; labels: (B, T), IGNORE_INDEX where none."""
        sequence = self.encoder(input_ids, attention_mask).sequence_output  # (B, T, C)
        logits = self.scores(sequence)  # (B, T, L)
        loss = None if labels is None else mean_cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)
        return TaskOutput(logits=logits, loss=loss)
