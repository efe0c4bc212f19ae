"""Masked-LM masking with the reference's semantics, vectorised over a batch of instances.

Per instance of n tokens (special tokens included), exactly ``min(max_predictions_per_seq,
max(1, round(n * masked_lm_prob)))`` positions are chosen among the non-special ones (fewer only when whole
words do not fit, as in the reference). Of those, 80% become [MASK], 10% a random token, 10% stay. Positions
are returned in increasing order, as the reference writes them.

One function serves both masking modes: data_prep calls it for static masking when it writes shards, and the
training collator calls it on every batch for dynamic masking. Randomness comes from per-instance seeds
through a counter-based hash, so the result for an instance does not depend on what else is in the batch.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from data_prep.seeding import uniform_at, uniform_keys

# Independent random streams per instance seed.
_STREAM_SELECT = 1
_STREAM_ACTION = 2
_STREAM_RANDOM_TOKEN = 3


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    whole_word_masking: bool = False
    mask_token_prob: float = 0.8    # share of chosen positions replaced by [MASK]
    random_token_prob: float = 0.1  # share replaced by a random token; the rest keep their token
    packed: bool = False            # rows of the MLM-only objective: a [SEP] between documents is never masked

    def __post_init__(self) -> None:
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if self.max_predictions_per_seq < 1:
            raise ValueError(f"max_predictions_per_seq must be >= 1, got {self.max_predictions_per_seq}")
        if self.mask_token_prob < 0 or self.random_token_prob < 0 or self.mask_token_prob + self.random_token_prob > 1:
            raise ValueError("mask_token_prob and random_token_prob must be >= 0 and sum to at most 1")


@dataclasses.dataclass(frozen=True)
class MaskingVocab:
    """What masking needs to know about the vocabulary, as ids."""

    mask_id: int
    replacement_ids: np.ndarray   # ids a random replacement is drawn from: every non-special token
    is_continuation: np.ndarray   # bool per id: a '##' word piece (for whole-word masking)
    separator_id: int = -1        # [SEP]: never masked inside packed rows

    @classmethod
    def from_tokens(cls, tokens: list[str], special_tokens: set[str], mask_token: str = "[MASK]") -> MaskingVocab:
        is_special = np.array([token in special_tokens for token in tokens])
        return cls(
            mask_id=tokens.index(mask_token),
            replacement_ids=np.flatnonzero(~is_special).astype(np.int64),
            is_continuation=np.array([token.startswith("##") for token in tokens]),
            separator_id=tokens.index("[SEP]") if "[SEP]" in tokens else -1,
        )


@dataclasses.dataclass
class MaskedBatch:
    input_ids: np.ndarray       # (N, L) with the chosen positions replaced
    positions: np.ndarray       # (N, P) masked positions, ascending, padded with 0
    labels: np.ndarray          # (N, P) original ids at those positions, padded with 0
    num_masked: np.ndarray      # (N,)


def num_to_predict(num_tokens: np.ndarray, config: MaskingConfig) -> np.ndarray:
    # np.rint rounds half to even, exactly like Python's round() in the reference.
    wanted = np.maximum(1, np.rint(num_tokens * config.masked_lm_prob).astype(np.int64))
    return np.minimum(config.max_predictions_per_seq, wanted)


def candidate_mask(width: int, num_tokens: np.ndarray, num_tokens_a: np.ndarray) -> np.ndarray:
    """(N, width) True where a token may be masked: everything but [CLS], the two [SEP]s and padding."""
    columns = np.arange(width)[None, :]
    num_tokens = np.asarray(num_tokens)[:, None]
    first_sep = np.asarray(num_tokens_a)[:, None] + 1
    return (columns > 0) & (columns < num_tokens - 1) & (columns != first_sep)


def mask_batch(
    input_ids: np.ndarray,
    num_tokens: np.ndarray,
    num_tokens_a: np.ndarray,
    instance_seeds: np.ndarray,
    config: MaskingConfig,
    vocab: MaskingVocab,
) -> MaskedBatch:
    """Mask a batch of `[CLS] A [SEP] B [SEP]` rows, padded to a common width; input_ids is not modified."""
    input_ids = np.asarray(input_ids)
    n_rows, width = input_ids.shape
    num_tokens = np.asarray(num_tokens, dtype=np.int64)
    candidates = candidate_mask(width, num_tokens, num_tokens_a)
    if config.packed:
        candidates &= input_ids != vocab.separator_id
    budget = np.minimum(num_to_predict(num_tokens, config), candidates.sum(axis=1))

    keys = uniform_keys(instance_seeds, width, _STREAM_SELECT)
    if config.whole_word_masking:
        chosen = _choose_whole_words(input_ids, candidates, keys, budget, vocab)
    else:
        chosen = _choose_smallest_keys(keys, candidates, budget)

    # The 80/10/10 draws, hashed only where a position was chosen.
    rows, cols = np.nonzero(chosen)  # row-major: positions ascend within each row
    seeds = np.asarray(instance_seeds, dtype=np.uint64)[rows]
    action = uniform_at(seeds, cols, _STREAM_ACTION)
    pick = uniform_at(seeds, cols, _STREAM_RANDOM_TOKEN)
    replacement = input_ids[rows, cols].copy()
    random_ids = vocab.replacement_ids[(pick * len(vocab.replacement_ids)).astype(np.int64)]
    use_mask = action < config.mask_token_prob
    use_random = ~use_mask & (action < config.mask_token_prob + config.random_token_prob)
    replacement[use_mask] = vocab.mask_id
    replacement[use_random] = random_ids[use_random]
    masked = input_ids.copy()
    masked[rows, cols] = replacement

    num_masked = chosen.sum(axis=1)
    slot = np.arange(len(rows)) - np.repeat(np.cumsum(num_masked) - num_masked, num_masked)
    positions = np.zeros((n_rows, config.max_predictions_per_seq), dtype=np.int64)
    labels = np.zeros((n_rows, config.max_predictions_per_seq), dtype=input_ids.dtype)
    positions[rows, slot] = cols
    labels[rows, slot] = input_ids[rows, cols]
    return MaskedBatch(masked, positions, labels, num_masked)


def _choose_smallest_keys(keys: np.ndarray, candidates: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """Per row, the `budget` candidates with the smallest keys: a uniformly random subset of exactly that size."""
    n_rows, width = keys.shape
    chosen = np.zeros((n_rows, width), dtype=bool)
    most = int(budget.max(initial=0))
    if most == 0:
        return chosen
    keys = np.where(candidates, keys, 2.0)  # never chosen: budget <= the row's candidate count
    # argpartition finds each row's `most` smallest in linear time; only those few are then ordered.
    smallest = np.argpartition(keys, most - 1, axis=1)[:, :most] if most < width else np.argsort(keys, axis=1)
    order = np.argsort(np.take_along_axis(keys, smallest, axis=1), axis=1)
    ranked = np.take_along_axis(smallest, order, axis=1)  # (N, most) positions, smallest key first
    take = np.arange(most)[None, :] < budget[:, None]
    chosen[np.nonzero(take)[0], ranked[take]] = True
    return chosen


def _choose_whole_words(input_ids, candidates, keys, budget, vocab: MaskingVocab) -> np.ndarray:
    """The reference's whole-word rule: words in random order, each taken whole if it still fits the budget.

    A word is a candidate token followed by its '##' pieces; a piece right after [SEP] starts a word of its own
    (the reference would glue it to the last word of segment A).
    """
    continuation = vocab.is_continuation[input_ids] & candidates
    continuation[:, 1:] &= candidates[:, :-1]
    continuation[:, 0] = False
    word_start = candidates & ~continuation
    chosen = np.zeros_like(candidates)
    for row in range(input_ids.shape[0]):
        starts = np.flatnonzero(word_start[row])
        if len(starts) == 0:
            continue
        row_candidates = np.flatnonzero(candidates[row])
        # A word runs from its start to just before the next start or the next non-candidate.
        word_of = np.searchsorted(starts, row_candidates, side="right") - 1
        lengths = np.bincount(word_of, minlength=len(starts))
        taken = 0
        limit = int(budget[row])
        for word in np.argsort(keys[row, starts], kind="stable"):
            if taken >= limit:
                break
            if taken + lengths[word] > limit:
                continue
            taken += lengths[word]
            chosen[row, row_candidates[word_of == word]] = True
    return chosen
