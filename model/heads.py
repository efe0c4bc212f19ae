"""Fine-tuning heads on BertModel: sentence (pair) classification or regression, and multiple choice.

Both read the pooled [CLS] state (model.bert.Pooler), as the BERT paper fine-tunes GLUE and SWAG, and are
transformers' BertForSequenceClassification and BertForMultipleChoice: the same computation, and the head's
parameters carry transformers' names (classifier.weight, classifier.bias), so model/hf_conversion.py converts a
head as is and only renames the encoder.

Shapes: B batch, K choices per example, T sequence length, C hidden size, L num_labels.
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.bert import BertModel, dropout, init_bert_weights
from model.config import BertConfig


@dataclasses.dataclass
class TaskOutput:
    logits: torch.Tensor  # (B, L) for sequence classification / regression, (B, K) for multiple choice
    loss: torch.Tensor | None = None  # mean over the batch, when labels are given


def regression_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean squared error of (B, 1) predictions against (B,) targets (transformers' problem_type "regression")."""
    # Flattened, not squeezed: a (B,) minus (B, 1) would broadcast to (B, B) without complaint.
    return F.mse_loss(logits.float().reshape(-1), labels.float().reshape(-1))


def choice_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (B, classes) logits against (B,) class ids; computed in fp32 under autocast."""
    return F.cross_entropy(logits.float(), labels.long())


class BertForSequenceClassification(nn.Module):
    """BertModel, dropout on the pooled output, and a linear layer to num_labels scores.

    num_labels == 1 is regression (STS-B): the single output is the prediction, trained with MSE. Otherwise
    classification with cross-entropy over the labels.
    """

    def __init__(self, config: BertConfig, num_labels: int):
        super().__init__()
        if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
            raise ValueError(f"num_labels must be a positive integer (1 for regression), got {num_labels!r}")
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        self.classifier.apply(functools.partial(init_bert_weights, std=config.initializer_range))
        self.dropout_p = config.hidden_dropout

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """input_ids, token_type_ids, attention_mask: (B, T), as for BertModel. labels: (B,) class ids, or
        targets (any numeric dtype, used as float) for regression."""
        pooled = self.bert(input_ids, token_type_ids, attention_mask).pooled_output  # (B, C)
        logits = self.classifier(dropout(pooled, self.dropout_p, self.training))  # (B, L)
        loss = None
        if labels is not None:
            loss = regression_loss(logits, labels) if self.is_regression else choice_loss(logits, labels)
        return TaskOutput(logits=logits, loss=loss)


class BertForMultipleChoice(nn.Module):
    """BertModel run on every (context, choice) pair, each scored by one linear unit; softmax over the choices.

    One scorer shared by all choices, rather than a K-way classifier on one input, so K need not be fixed and
    each pair is encoded on its own, as the BERT paper does for SWAG.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.classifier.apply(functools.partial(init_bert_weights, std=config.initializer_range))
        self.dropout_p = config.hidden_dropout

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """input_ids, token_type_ids, attention_mask: (B, K, T); labels: (B,) index of the right choice."""
        B, K, T = input_ids.shape
        # The K pairs of an example are independent sequences to the encoder: fold them into the batch.
        flat = [None if x is None else x.reshape(B * K, T) for x in (input_ids, token_type_ids, attention_mask)]
        pooled = self.bert(*flat).pooled_output  # (B * K, C)
        scores = self.classifier(dropout(pooled, self.dropout_p, self.training))  # (B * K, 1)
        logits = scores.view(B, K)
        return TaskOutput(logits=logits, loss=None if labels is None else choice_loss(logits, labels))
