"""What the encoders and their heads return, for both architectures (BERT's and ModernBERT's share them, so the
training and fine-tuning modules read one shape), and the label value that takes no part in a loss."""
from __future__ import annotations

import dataclasses

import torch

IGNORE_INDEX = -100  # label of a slot that takes no part in a loss (padding of masked_positions)


@dataclasses.dataclass
class EncoderOutput:
    sequence_output: torch.Tensor  # (B, T, C) the last layer's states
    pooled_output: torch.Tensor | None  # (B, C) tanh(dense([CLS] state)); None for a BertModel without pooler
    hidden_states: tuple[torch.Tensor, ...] | None = None  # embeddings + each layer: num_layers + 1 of (B, T, C)


@dataclasses.dataclass
class PreTrainingOutput:
    mlm_logits: torch.Tensor  # (B, P, V) at masked_positions, or (B, T, V) when no positions are given
    nsp_logits: torch.Tensor | None  # (B, 2), or (B, K, 2) for packed rows of K pairs; class 1 = sentence B is
    # random (google-research/bert's convention); None for a model without the next-sentence head (MLM only)
    # With labels: the losses, and counts a training loop sums (across steps and ranks) for accuracies:
    # mlm_acc = mlm_correct / mlm_total, nsp_acc = nsp_correct / nsp_total. Counts are 0-dim int64 tensors,
    # so logging them needs no host sync until the loop asks.
    loss: torch.Tensor | None = None  # mlm_loss + nsp_loss (or whichever of the two has labels)
    mlm_loss: torch.Tensor | None = None  # mean cross-entropy over the non-ignored MLM slots
    nsp_loss: torch.Tensor | None = None  # mean cross-entropy over the batch's sequences (pairs, when packed)
    mlm_correct: torch.Tensor | None = None
    mlm_total: torch.Tensor | None = None
    nsp_correct: torch.Tensor | None = None
    nsp_total: torch.Tensor | None = None


@dataclasses.dataclass
class TaskOutput:
    # (B, L) sequence classification / regression, (B, K) multiple choice, (B, T, 2) question answering
    # ([..., 0] start, [..., 1] end scores), (B, T, L) token classification
    logits: torch.Tensor
    loss: torch.Tensor | None = None  # mean over the batch (per-token heads: its labelled positions), given labels


def _check_num_labels(num_labels: int, note: str = "") -> None:
    if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
        raise ValueError(f"num_labels must be a positive integer{note}, got {num_labels!r}")
