"""Who attends to whom in ModernBERT, as the masks its two attention paths take: dense boolean masks for SDPA, and
BlockMasks for flex_attention.

The rule (model/shared/document_masks.py, which BERT's packed sentence pairs use too): a token attends to the real
tokens of its own document of its own row; on local (sliding-window) layers
only to those at most local_attention // 2 positions away (transformers' inclusive half-window). Packed rows thus
attend as if each document were a row of its own, and padding is never attended to. A padding query attends to
itself alone: it has no document, and a query row with no key at all would make SDPA's softmax NaN. Nothing reads
the states of padding, so that choice is free, and both paths make it, so they agree everywhere.

Shapes: B batch, T sequence length, N computed (unpadded) tokens.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from model.shared.document_masks import document_attention_mask, may_attend, token_documents
from model.shared.unpadding import UnpaddedLayout

__all__ = ["AttentionMasks", "build_attention_masks", "may_attend", "sdpa_masks", "token_documents"]

# Global document ids in the unpadded layout: row * _ROW_STRIDE + document, so that two rows' documents never meet
# whatever their ids within a row (any id below 2^32).
_ROW_STRIDE = 2 ** 32


@dataclasses.dataclass
class AttentionMasks:
    """What the layers of one forward pass attend with, built once for all of them."""
    backend: str  # "sdpa" or "flex"
    global_mask: object  # (B, 1, T, T) bool / BlockMask / None (attend to everything)
    local_mask: object
    # Where q, k, v are when attention runs: the padded rows (B, T), or with flex and unpadding the N tokens.
    on_tokens: bool

    def for_layer(self, is_global: bool):
        return self.global_mask if is_global else self.local_mask


def build_attention_masks(backend: str, documents: torch.Tensor | None, unpadded: UnpaddedLayout | None,
                          seq_len: int, half_window: int, device: torch.device) -> AttentionMasks:
    """The global and local masks of a forward pass. documents: token_documents(...) (B, T) or None."""
    if backend == "sdpa":
        return AttentionMasks("sdpa", *sdpa_masks(documents, seq_len, half_window, device), on_tokens=False)
    if backend != "flex":
        raise ValueError(f"unknown attention backend {backend!r}")
    if unpadded is None:
        return AttentionMasks("flex", *flex_row_masks(documents, seq_len, half_window, device), on_tokens=False)
    return AttentionMasks("flex", *flex_token_masks(documents, unpadded, half_window), on_tokens=True)


def sdpa_masks(documents: torch.Tensor | None, seq_len: int, half_window: int,
               device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(global, local) boolean masks, True where a query may attend to a key: (B, 1, T, T), or (1, 1, T, T) for rows
    without padding or documents; None where every key may be attended to (SDPA's fastest, mask-free kernels)."""
    positions = torch.arange(seq_len, device=device)
    q_position, k_position = positions[:, None], positions[None, :]  # (T, 1), (1, T)
    if documents is None:
        window_covers_row = seq_len - 1 <= half_window
        local = None if window_covers_row else (q_position - k_position).abs().le(half_window)[None, None]
        return None, local
    global_mask = document_attention_mask(documents)  # (B, 1, T, T), broadcast over heads
    return global_mask, global_mask & (q_position - k_position).abs().le(half_window)


def _create_block_mask(mask_mod, batch_size: int, seq_len: int, device: torch.device):
    from torch.nn.attention.flex_attention import create_block_mask

    # Compiled on a GPU: eager building materialises the whole (B, T, T) mask, which for N unpadded tokens of a
    # large batch is N^2 bytes. On the CPU the compile costs more (seconds) than the eager build of a small mask.
    return create_block_mask(mask_mod, batch_size, None, seq_len, seq_len, device=device,
                             _compile=device.type == "cuda")


def flex_row_masks(documents: torch.Tensor | None, seq_len: int, half_window: int, device: torch.device):
    """(global, local) BlockMasks over the padded (B, T) rows; global None for rows without padding or documents."""
    positions = torch.arange(seq_len, device=device)  # (T,)

    def window_mod(b, h, q, k):
        return (positions[q] - positions[k]).abs() <= half_window

    if documents is None:  # one mask for every row (a BlockMask of batch 1 broadcasts)
        return None, None if seq_len - 1 <= half_window else _create_block_mask(window_mod, 1, seq_len, device)

    def document_mod(b, h, q, k):
        return may_attend(documents[b, q], documents[b, k], positions[q], positions[k], None)

    def local_mod(b, h, q, k):
        return may_attend(documents[b, q], documents[b, k], positions[q], positions[k], half_window)

    batch_size = documents.shape[0]
    return (_create_block_mask(document_mod, batch_size, seq_len, device),
            _create_block_mask(local_mod, batch_size, seq_len, device))


def flex_token_masks(documents: torch.Tensor | None, unpadded: UnpaddedLayout, half_window: int):
    """(global, local) BlockMasks over the N unpadded tokens as one sequence (batch 1): no padding is computed."""
    index = unpadded.token_index  # (N,) flat positions b * T + t
    B, T = unpadded.batch_size, unpadded.seq_len
    if documents is None:  # every position real, one document per row: documents are the rows
        documents = torch.zeros((B, T), dtype=torch.long, device=index.device)
    rows = torch.arange(B, device=index.device)[:, None] * _ROW_STRIDE  # (B, 1)
    global_documents = torch.where(documents >= 0, documents + rows, -1).flatten().index_select(0, index)  # (N,)
    mod = functools.partial(_token_mod, global_documents, index)

    def global_mod(b, h, q, k):
        return mod(q, k, None)

    def local_mod(b, h, q, k):
        return mod(q, k, half_window)

    N, device = len(index), index.device
    return _create_block_mask(global_mod, 1, N, device), _create_block_mask(local_mod, 1, N, device)


def _token_mod(documents: torch.Tensor, positions: torch.Tensor, q, k, half_window: int | None):
    return may_attend(documents[q], documents[k], positions[q], positions[k], half_window)
