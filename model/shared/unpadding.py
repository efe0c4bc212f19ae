"""Unpadding: the encoder's per-token work done on a padded batch's real tokens only (MosaicBERT's idea).

At seq 512 about 15% of a phase-2 batch is padding, and the padded encoder spends its matmuls, dropout, residual
additions and LayerNorms on those positions as on any other. With a `token_index`, BertModel runs the embeddings on the
padded (B, T) batch (cheap), takes the N tokens out once, (B, T, C) -> (N, C), runs every layer on (N, C), and puts
the last layer's states back, (N, C) -> (B, T, C), with zeros where nothing was computed: the heads, masked_positions,
the pooler and hidden_states then read the padded layout as before.

- The index comes from the host: the collator (pipeline/pretraining/data/collator.py, unpad=True) knows each row's
  length and sends the flat indices b * T + t of the real tokens, row by row, then of a few padding positions that
  round N up (to 16 and pad_to_multiple_of). N is then a shape, known to the host without reading the device
  (MosaicBERT's unpad_input computes the index from the mask on the device, with nonzero(): a device-to-host sync).
  Those padding positions compute exactly what the padded model computes there; nothing reads them.
- Attention alone needs the rows: q, k, v go back into (B, T, 3C) (zeros at padding, which the key padding mask
  keeps out of every softmax), through the padded path's SDPA, dropout included, and the output comes out to (N, C)
  again. Attention's scores and weighted sum are ~8% of BERT-Large's FLOPs at T = 512, so this keeps ~all the gain
  and runs wherever SDPA does. A varlen (flash) kernel would skip the re-padding but has no dropout in torch 2.13
  (torch.nn.attention.varlen.varlen_attn, CUDA only).
- Numerics: without dropout, the same as the padded model up to float rounding (every matmul has other row counts,
  so other blockings). With dropout, the masks are drawn over (N, C), not (B, T, C): other random numbers (the same
  distribution), hence another, equally valid, training run.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class UnpaddedLayout(NamedTuple):
    """Where the N computed tokens of a padded (B, T) batch sit: token_index (N,) holds their flat indices b * T + t,
    each at most once (pad() writes every token to its own position; with a repeat, one of two writes would be lost)."""
    token_index: torch.Tensor  # (N,) int64
    batch_size: int
    seq_len: int

    @classmethod
    def of(cls, token_index: torch.Tensor | None, input_ids: torch.Tensor,
           attention_mask: torch.Tensor | None) -> UnpaddedLayout | None:
        """The layout of a batch given `token_index` by its collator; None (the padded path) without one."""
        if token_index is None:
            return None
        B, T = input_ids.shape
        if attention_mask is None and len(token_index) < B * T:
            # The positions left out hold zero keys in attention, which only the mask keeps out of the softmax.
            raise ValueError(f"token_index covers {len(token_index)} of {B * T} positions, but there is no "
                             "attention_mask to mask the others")
        return cls(token_index.long(), B, T)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...): the computed tokens, in token_index's order."""
        return x.flatten(0, 1).index_select(0, self.token_index)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...): each token back at its position, zeros where none was computed."""
        rows = x.new_zeros((self.batch_size * self.seq_len, *x.shape[1:]))
        return rows.index_copy(0, self.token_index, x).unflatten(0, (self.batch_size, self.seq_len))
