"""Fine-tuning heads on BertModel: sentence (pair) classification or regression, multiple choice, question
answering (answer span), and token classification.

The first two read the pooled [CLS] state (model.bert.Pooler), as the BERT paper fine-tunes GLUE and SWAG; the
last two read every token's final state, as it fine-tunes SQuAD and CoNLL-2003 NER, and have no pooler. Each is
transformers' class of the same name: the same computation, and the head's parameters carry transformers' names
(classifier.*, qa_outputs.*), so model/bert/hf_conversion.py converts a head as is and only renames the encoder.

Shapes: B batch, K choices per example, T sequence length, C hidden size, L num_labels.
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn

from model.bert.config import BertConfig
from model.bert.model import BertModel, init_bert_weights
from model.shared.dropout import dropout
from model.shared.losses import choice_loss, mean_cross_entropy, regression_loss, span_loss
from model.shared.outputs import IGNORE_INDEX, TaskOutput, _check_num_labels


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
