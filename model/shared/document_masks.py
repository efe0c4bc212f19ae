"""Who attends to whom when a row holds several documents (ModernBERT's packed documents, BERT's packed sentence
pairs): a token attends to the real tokens of its own document of its own row, so that each document is encoded as
if it were a row of its own. A padding token attends to itself alone: it has no document, and a query with no key
at all would make SDPA's softmax NaN; nothing reads the states of padding, so that choice is free.

Both architectures build their dense (SDPA) masks here; ModernBERT's sliding windows and FlexAttention BlockMasks
(model/modernbert/attention_masks.py) are built on the same rule, may_attend.

Shapes: B batch, T sequence length.
"""
from __future__ import annotations

import torch


def token_documents(attention_mask: torch.Tensor | None, document_ids: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) document of each token within its row, -1 at padding; None when each row is one document without
    padding (then no mask is needed)."""
    if document_ids is None and attention_mask is None:
        return None
    documents = document_ids.long() if document_ids is not None else torch.zeros_like(attention_mask, dtype=torch.long)
    if attention_mask is not None:
        documents = documents.masked_fill(attention_mask == 0, -1)
    return documents


def may_attend(q_document: torch.Tensor, k_document: torch.Tensor, q_position: torch.Tensor,
               k_position: torch.Tensor, half_window: int | None) -> torch.Tensor:
    """The rule above for (broadcast) pairs of query and key: their documents (-1 = padding) and positions in the row
    (or, unpadded, flat positions b * T + t: the same differences within a row). half_window: a sliding window of
    that many positions each side (ModernBERT's local layers); None: the whole document."""
    allowed = ((q_document == k_document) & (k_document >= 0)) | (q_position == k_position)
    if half_window is not None:
        allowed = allowed & ((q_position - k_position).abs() <= half_window)
    return allowed


def document_attention_mask(documents: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) boolean, True where a query may attend to a key, from token_documents(...) (B, T): block-diagonal
    per row, one block per document (broadcast over the heads)."""
    positions = torch.arange(documents.shape[1], device=documents.device)
    allowed = may_attend(documents[:, :, None], documents[:, None, :], positions[:, None], positions[None, :], None)
    return allowed[:, None]  # (B, 1, T, T)
