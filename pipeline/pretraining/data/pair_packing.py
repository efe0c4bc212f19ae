"""MLPerf-style packing of BERT's sentence pairs (Krell et al. 2021, "Efficient Sequence Packing without
Cross-contamination"): a micro-batch's pairs, collated one per row, are repacked into fewer rows of at most
max_seq_length tokens, up to K pairs a row, each pair attending within itself (model/bert/model.py, document_ids).

Where: in the collator, with the micro-batch as the packing window, not in the Beam job. A packed batch then holds
exactly the pairs the unpacked micro-batch holds, so it has the unpacked batch's losses and gradients (MLM per
scored token, NSP per pair: tests/model/test_bert_packing.py), and everything counted in rows stays as it is: the
epoch plan, exact resume, batch-size warm-up, the per-row seeds of dynamic masking, the shard data contract (every
existing phase-2 set packs as it is). The price: the number of rows R of a batch varies (R <= B), and a window of one
micro-batch packs a little less tightly than a whole-set packing would.

How: first-fit-decreasing (FFD): the pairs by length, longest first (ties in batch order: a stable sort), each into
the first row that has room for it and fewer than K pairs, else into a new row. A pure function of the batch's
lengths, so a batch packs the same way on every rank, worker and restart. FFD rather than NVIDIA's histogram-based
packing (SPFHP/NNLSHP of the same paper, used in MLPerf BERT): those pick combinations from the length histogram of a
whole data set, offline; a window of tens of pairs is too few for a histogram to help, and FFD is within 11/9 of the
optimal row count there, in O(B R) steps. K bounds the shapes of the per-pair fields (MLPerf BERT packs at most 3).

A packed batch, beside the collator's fields (input_ids, token_type_ids, attention_mask (R, T), T the longest packed
row rounded as the collator rounds widths):
  document_ids (R, T)             the slot of the pair each token is in (0, 0, ..., 1, 1, ...), -1 at padding
  position_ids (R, T)             the token's position in its pair: 0 at each pair's [CLS]
  cls_positions (R, K)            where each pair's [CLS] is; 0 in empty slots
  next_sentence_labels (R, K)     each pair's label, -100 in empty slots
  masked_positions (R, K * P)     every pair's masked positions, in the packed row, pair after pair; then 0
  masked_lm_labels (R, K * P)     their labels; -100 after them
  row_index (R, K)                with return_row_index: each pair's row index, -1 in empty slots
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from model.shared.outputs import IGNORE_INDEX

MLPERF_MAX_PAIRS_PER_ROW = 3   # MLPerf BERT's packing: at most 3 sequences in a row


def first_fit_decreasing(lengths: np.ndarray, capacity: int, max_per_row: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, slot) of each item: FFD bin packing of `lengths` into rows of `capacity`, at most max_per_row items a
    row; slot is the item's place in its row (the order it went in)."""
    if max_per_row < 1:
        raise ValueError(f"max_per_row must be >= 1, got {max_per_row}")
    if len(lengths) and int(np.max(lengths)) > capacity:
        raise ValueError(f"an item of {int(np.max(lengths))} tokens does not fit a row of {capacity}")
    row = np.empty(len(lengths), dtype=np.int64)
    slot = np.empty(len(lengths), dtype=np.int64)
    free: list[int] = []    # per row: tokens left
    count: list[int] = []   # per row: items in it
    for item in np.argsort(-np.asarray(lengths), kind="stable"):
        n = int(lengths[item])
        target = next((r for r in range(len(free)) if free[r] >= n and count[r] < max_per_row), len(free))
        if target == len(free):
            free.append(capacity)
            count.append(0)
        row[item], slot[item] = target, count[target]
        free[target] -= n
        count[target] += 1
    return row, slot


def _starts_within_rows(sizes: np.ndarray, row: np.ndarray, slot: np.ndarray) -> np.ndarray:
    """Per item, the sum of `sizes` of the items before it in its row (by slot)."""
    order = np.lexsort((slot, row))   # by row, then slot
    ends = np.cumsum(sizes[order])
    starts_sorted = ends - sizes[order]
    first_of_row = np.flatnonzero(np.r_[True, row[order][1:] != row[order][:-1]])
    row_base = np.repeat(starts_sorted[first_of_row], np.diff(np.r_[first_of_row, len(order)]))
    starts = np.empty_like(sizes)
    starts[order] = starts_sorted - row_base
    return starts


def pack_pairs(batch: dict[str, np.ndarray], max_seq_length: int, max_pairs_per_row: int,
               padded_length: Callable[[np.ndarray], int], pad_id: int) -> dict[str, np.ndarray]:
    """The packed batch (see the module docstring) of a collated one-pair-per-row `batch` (the collator's fields,
    attention_mask included). padded_length: the width of a batch from its rows' lengths (the collator's rounding)."""
    is_token = batch["attention_mask"].astype(bool)                                       # (B, W)
    lengths = is_token.sum(axis=1)
    row, slot = first_fit_decreasing(lengths, max_seq_length, max_pairs_per_row)
    n_rows, K = int(row.max()) + 1 if len(row) else 0, max_pairs_per_row
    offset = _starts_within_rows(lengths, row, slot)                                      # (B,) [CLS] of each pair
    width = padded_length(np.bincount(row, weights=lengths, minlength=n_rows).astype(np.int64))

    pair, column = np.nonzero(is_token)                                                   # every real token
    to_row, to_column = row[pair], offset[pair] + column
    packed = {}
    for name, fill in (("input_ids", pad_id), ("token_type_ids", 0), ("attention_mask", 0)):
        packed[name] = np.full((n_rows, width), fill, dtype=np.int64)
        packed[name][to_row, to_column] = batch[name][pair, column]
    packed["document_ids"] = np.full((n_rows, width), -1, dtype=np.int64)
    packed["document_ids"][to_row, to_column] = slot[pair]
    packed["position_ids"] = np.zeros((n_rows, width), dtype=np.int64)
    packed["position_ids"][to_row, to_column] = column
    packed["cls_positions"] = np.zeros((n_rows, K), dtype=np.int64)
    packed["cls_positions"][row, slot] = offset

    labels = batch["masked_lm_labels"]                                                    # (B, P)
    scored = labels != IGNORE_INDEX
    first_score = _starts_within_rows(scored.sum(axis=1), row, slot)   # each pair's first slot in its packed row
    pair, p = np.nonzero(scored)
    to_slot = first_score[pair] + np.cumsum(scored, axis=1)[pair, p] - 1
    packed["masked_positions"] = np.zeros((n_rows, K * labels.shape[1]), dtype=np.int64)
    packed["masked_positions"][row[pair], to_slot] = batch["masked_positions"][pair, p] + offset[pair]
    packed["masked_lm_labels"] = np.full((n_rows, K * labels.shape[1]), IGNORE_INDEX, dtype=np.int64)
    packed["masked_lm_labels"][row[pair], to_slot] = labels[pair, p]

    for name, fill in (("next_sentence_labels", IGNORE_INDEX), ("row_index", -1)):
        if name in batch:
            packed[name] = np.full((n_rows, K), fill, dtype=np.int64)
            packed[name][row, slot] = batch[name]
    return packed


def packing_efficiency(attention_mask: np.ndarray, width: int) -> float:
    """Real tokens over the token slots of rows `width` wide: 1.0 when no slot is padding."""
    return float(attention_mask.sum()) / (attention_mask.shape[0] * width)
