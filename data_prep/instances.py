"""Sentence-pair instances with google-research/bert's semantics (create_instances_from_document).

Per document and per copy: a target length of max_seq_length - 3, or with probability short_seq_prob a random
length in [2, that]; sentences gathered until the target; a random split point for A; with probability 0.5
(always for a one-sentence chunk) B comes from a random *other* document of the bucket and the unused
sentences are put back; the pair is truncated from the longer side, front or back at random.

Deliberate differences from the reference, each keeping its distribution:
- the random document is drawn uniformly from the *other* documents of the bucket, so a "random" B never
  comes from the same document while the bucket has another (the reference's ten tries could fail and then
  label same-document text as random, even its actual continuation: a known bug);
- a bucket of one document (a single book, one large record) has no other document: B then comes from a
  random place of the same document at least one full sequence away from A's chunk, so it is never A's
  continuation nor the neighbouring chunk's text. Without this, such corpora get no NSP negatives at all
  (the reference, whose B can come from anywhere in the same document, still gives about half). Each such
  B is counted; a chunk with no place far enough counts as without a random document and takes its next;
- truncation computes how many tokens each side loses in O(1) and draws the front/back split as a binomial,
  instead of one coin per removed token (the same distribution; a 10 MB line costs no more than a short one).

Instances are spans into the documents' flat token arrays, so nothing is copied until the shard is written.
"""
from __future__ import annotations

import bisect
import dataclasses
import random
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    random_next_prob: float = 0.5

    def __post_init__(self) -> None:
        if self.max_seq_length < 5:
            raise ValueError(f"max_seq_length must be >= 5 ([CLS] A [SEP] B [SEP]), got {self.max_seq_length}")
        for name in ("short_seq_prob", "random_next_prob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")


@dataclasses.dataclass
class TokenizedDocument:
    """A document as one flat array of token ids, cut into sentences at sentence_ends (exclusive offsets)."""

    key: str
    token_ids: np.ndarray
    sentence_ends: np.ndarray

    def __post_init__(self) -> None:
        # Python lists: the instance loop does scalar look-ups, which are far faster on lists than arrays.
        self._ends = self.sentence_ends.tolist()
        self._starts = [0] + self._ends[:-1]


class Instance(NamedTuple):
    """Spans of token ids: A = docs[a_doc][a_start:a_end], B = docs[b_doc][b_start:b_end]."""

    a_doc: int
    a_start: int
    a_end: int
    b_doc: int
    b_start: int
    b_end: int
    is_random_next: bool
    is_short_target: bool   # the document-copy drew a target shorter than max_seq_length - 3


@dataclasses.dataclass
class InstanceCounts:
    """Events the statistics need that instances alone do not show."""

    # A chunk wanted a random B but found none: no other document in the bucket, and no place in its own
    # document far enough from A. It took its actual next (or, a one-sentence chunk, made no instance).
    chunks_without_random_document: int = 0
    random_next_from_same_document: int = 0   # random Bs taken far from A in A's own document (one-document bucket)
    one_sentence_chunk_instances: int = 0     # instances whose chunk had one sentence: B had to be random


def create_instances_from_document(
    documents: Sequence[TokenizedDocument],
    doc_index: int,
    rng: random.Random,
    config: InstanceConfig,
    counts: InstanceCounts,
) -> list[Instance]:
    document = documents[doc_index]
    starts, ends = document._starts, document._ends
    max_num_tokens = config.max_seq_length - 3
    target_length = max_num_tokens
    if rng.random() < config.short_seq_prob:
        target_length = _randint(rng, 2, max_num_tokens)
    is_short = target_length < max_num_tokens

    instances: list[Instance] = []
    chunk_first = 0      # first sentence of the chunk being gathered
    chunk_length = 0
    i = 0
    while i < len(ends):
        chunk_length += ends[i] - starts[i]
        if i == len(ends) - 1 or chunk_length >= target_length:
            num_segments = i - chunk_first + 1
            a_segments = _randint(rng, 1, num_segments - 1) if num_segments >= 2 else 1
            a_start, a_end = starts[chunk_first], ends[chunk_first + a_segments - 1]
            use_random = num_segments == 1 or rng.random() < config.random_next_prob
            random_b = None
            if use_random:
                b_length = target_length - (a_end - a_start)
                if len(documents) >= 2:
                    random_b = _b_from_other_document(documents, doc_index, b_length, rng)
                else:
                    # At least a whole sequence away: never A's continuation, nor the next chunk's text.
                    random_b = _b_far_in_same_document(documents, doc_index, starts[chunk_first], ends[i],
                                                       b_length, max_num_tokens, rng)
                    counts.random_next_from_same_document += random_b is not None
                if random_b is None:
                    counts.chunks_without_random_document += 1
                    use_random = False
                    if num_segments == 1:   # nothing to pair with: the chunk yields no instance
                        chunk_first, chunk_length = i + 1, 0
                        i += 1
                        continue
            if use_random:
                b_doc, b_start, b_end = random_b
                i -= num_segments - a_segments    # put the unused sentences back
            else:
                b_doc, b_start, b_end = doc_index, a_end, ends[i]
            counts.one_sentence_chunk_instances += num_segments == 1
            a_start, a_end, b_start, b_end = _truncate_pair(a_start, a_end, b_start, b_end, max_num_tokens, rng)
            instances.append(Instance(doc_index, a_start, a_end, b_doc, b_start, b_end, use_random, is_short))
            chunk_first, chunk_length = i + 1, 0
        i += 1
    return instances


def _b_from_other_document(documents: Sequence[TokenizedDocument], doc_index: int, b_length: int,
                           rng: random.Random) -> tuple[int, int, int]:
    """A random B from a uniformly drawn *other* document: (document, start, end)."""
    b_doc = _randint(rng, 0, len(documents) - 2)
    if b_doc >= doc_index:
        b_doc += 1
    other = documents[b_doc]
    first = _randint(rng, 0, len(other._ends) - 1)
    return (b_doc, *_b_span(other, first, len(other._ends) - 1, b_length))


def _b_far_in_same_document(documents: Sequence[TokenizedDocument], doc_index: int, chunk_start: int,
                            chunk_end: int, b_length: int, min_distance: int,
                            rng: random.Random) -> tuple[int, int, int] | None:
    """A random B from A's own document, wholly `min_distance` tokens or more before or after A's chunk
    [chunk_start, chunk_end); None where the document has no such place."""
    document = documents[doc_index]
    starts, ends = document._starts, document._ends
    before = bisect.bisect_right(ends, chunk_start - min_distance)   # sentences [0, before) end far enough before
    after = bisect.bisect_left(starts, chunk_end + min_distance)     # sentences [after, n) start far enough after
    candidates = before + len(ends) - after
    if candidates <= 0:
        return None
    pick = _randint(rng, 0, candidates - 1)
    # Before A, B stops at the last sentence that still ends far enough from A.
    first, last_allowed = (pick, before - 1) if pick < before else (after + pick - before, len(ends) - 1)
    return (doc_index, *_b_span(document, first, last_allowed, b_length))


def _b_span(document: TokenizedDocument, first: int, last_allowed: int, b_length: int) -> tuple[int, int]:
    """Sentences from `first` on until B reaches `b_length` tokens (at least one sentence, none past
    `last_allowed`): (start, end) token offsets."""
    b_start = document._starts[first]
    last = bisect.bisect_left(document._ends, b_start + b_length, lo=first)
    return b_start, document._ends[min(last, last_allowed)]


def _truncate_pair(a_start, a_end, b_start, b_end, max_num_tokens, rng: random.Random):
    """The reference's truncate_seq_pair in O(1): tokens leave the longer side (B on a tie), front or back."""
    len_a, len_b = a_end - a_start, b_end - b_start
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return a_start, a_end, b_start, b_end
    cut_a = cut_b = 0
    if len_a > len_b:
        cut_a = min(excess, len_a - len_b)
    elif len_b > len_a:
        cut_b = min(excess, len_b - len_a)
    rest = excess - cut_a - cut_b
    cut_b += (rest + 1) // 2   # once level, removals alternate starting with B
    cut_a += rest // 2
    front_a = _binomial_half(cut_a, rng)
    front_b = _binomial_half(cut_b, rng)
    return a_start + front_a, a_end - (cut_a - front_a), b_start + front_b, b_end - (cut_b - front_b)


def _randint(rng: random.Random, low: int, high: int) -> int:
    """Uniform in [low, high]; from one random() call, several times faster than rng.randint (bias < 2**-40)."""
    return low + int(rng.random() * (high - low + 1))


def _binomial_half(trials: int, rng: random.Random) -> int:
    """Binomial(trials, 0.5): the number of fronts among `trials` fair front-or-back coins."""
    return int(rng.getrandbits(trials)).bit_count() if trials > 0 else 0
