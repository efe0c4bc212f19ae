"""Fine-tuning heads on BertModel: sentence (pair) classification or regression, multiple choice, question
answering (answer span), and token classification.

The first two read the pooled [CLS] state (model.bert.Pooler), as the BERT paper fine-tunes GLUE and SWAG; the
last two read every token's final state, as it fine-tunes SQuAD and CoNLL-2003 NER, and have no pooler. Each is
transformers' class of the same name: the same computation, and the head's parameters carry transformers' names
(classifier.*, qa_outputs.*), so model/hf_conversion.py converts a head as is and only renames the encoder.

Shapes: B batch, K choices per example, T sequence length, C hidden size, L num_labels.
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.bert import IGNORE_INDEX, BertModel, dropout, init_bert_weights
from model.config import BertConfig


@dataclasses.dataclass
class TaskOutput:
    # (B, L) sequence classification / regression, (B, K) multiple choice, (B, T, 2) question answering
    # ([..., 0] start, [..., 1] end scores), (B, T, L) token classification
    logits: torch.Tensor
    loss: torch.Tensor | None = None  # mean over the batch (per-token heads: its labelled positions), given labels


def regression_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean squared error of (B, 1) predictions against (B,) targets (transformers' problem_type "regression")."""
    # Flattened, not squeezed: a (B,) minus (B, 1) would broadcast to (B, B) without complaint.
    return F.mse_loss(logits.float().reshape(-1), labels.float().reshape(-1))


def choice_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (B, classes) logits against (B,) class ids; computed in fp32 under autocast."""
    return F.cross_entropy(logits.float(), labels.long())


def mean_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """F.cross_entropy's mean of (..., classes) logits against (...) labels, over the labels != ignore_index.

    In fp32 under autocast. Where none is counted the loss is 0, not F.cross_entropy's (and transformers') NaN 0/0:
    such a batch has nothing to learn, and one NaN would end the run.
    """
    logits = logits.reshape(-1, logits.shape[-1]).float()  # (N, classes)
    labels = labels.reshape(-1).long()  # (N,)
    summed = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")
    return summed / (labels != ignore_index).sum().clamp(min=1)


def span_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers' BertForQuestionAnswering loss: the mean of the start and the end cross-entropies over the T
    positions. logits (B, T, 2); labels (B, 2) the start and end token positions.

    Positions are clamped to [0, T] and T is ignored: an answer beyond the sequence takes no part, and a
    negative position counts as 0 ([CLS]), as in transformers. Start and end are averaged separately, so a row
    whose end alone is ignored still trains its start.
    """
    B, T, _ = logits.shape
    if labels.shape != (B, 2):
        raise ValueError(f"span labels must be (B, 2) = {(B, 2)} start and end positions, got {tuple(labels.shape)}")
    positions = labels.long().clamp(0, T)  # (B, 2)
    start = mean_cross_entropy(logits[..., 0], positions[:, 0], ignore_index=T)
    end = mean_cross_entropy(logits[..., 1], positions[:, 1], ignore_index=T)
    return (start + end) / 2


def _check_num_labels(num_labels: int, note: str = "") -> None:
    if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
        raise ValueError(f"num_labels must be a positive integer{note}, got {num_labels!r}")


class BertForSequenceClassification(nn.Module):
    """BertModel, dropout on the pooled output, and a linear layer to num_labels scores.

    num_labels == 1 is regression (STS-B): the single output is the prediction, trained with MSE. Otherwise
    classification with cross-entropy over the labels.
    """

    def __init__(self, config: BertConfig, num_labels: int):
        super().__init__()
        _check_num_labels(num_labels, " (1 for regression)")
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


class BertForQuestionAnswering(nn.Module):
    """BertModel without its pooler, and one linear layer scoring every token as the answer's start and its end.

    The BERT paper's SQuAD head: a start vector S and an end vector E dotted with each token's final state (the two
    rows of qa_outputs, plus transformers' bias). No dropout between the encoder and the scores: neither
    google-research/bert's run_squad.py nor transformers has one there.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.qa_outputs.apply(functools.partial(init_bert_weights, std=config.initializer_range))

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """input_ids, token_type_ids, attention_mask: (B, T); labels: (B, 2) the answer's start and end token
        positions (see span_loss for those outside the sequence)."""
        sequence = self.bert(input_ids, token_type_ids, attention_mask).sequence_output  # (B, T, C)
        logits = self.qa_outputs(sequence)  # (B, T, 2)
        return TaskOutput(logits=logits, loss=None if labels is None else span_loss(logits, labels))


class BertForTokenClassification(nn.Module):
    """BertModel without its pooler, dropout on every token's final state, and a linear layer to num_labels scores.

    The BERT paper's NER head (CoNLL-2003): each token classified on its own, without a CRF. Tokens without a label
    (padding, special tokens, a word's later sub-tokens) carry IGNORE_INDEX (-100) and take no part in the loss.
    """

    def __init__(self, config: BertConfig, num_labels: int):
        super().__init__()
        _check_num_labels(num_labels)
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        self.classifier.apply(functools.partial(init_bert_weights, std=config.initializer_range))
        # transformers' classifier_dropout, when a config sets it, is not ours: hidden_dropout, its default, is.
        self.dropout_p = config.hidden_dropout

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """input_ids, token_type_ids, attention_mask: (B, T); labels: (B, T) label ids, IGNORE_INDEX where none."""
        sequence = self.bert(input_ids, token_type_ids, attention_mask).sequence_output  # (B, T, C)
        logits = self.classifier(dropout(sequence, self.dropout_p, self.training))  # (B, T, L)
        loss = None if labels is None else mean_cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)
        return TaskOutput(logits=logits, loss=loss)
