"""The instance algorithm against google-research/bert's semantics."""
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep.instances import (
    InstanceConfig,
    InstanceCounts,
    TokenizedDocument,
    _truncate_pair,
    create_instances_from_document,
)


def make_document(key: str, sentence_lengths: list[int], first_id: int = 0) -> TokenizedDocument:
    total = sum(sentence_lengths)
    return TokenizedDocument(key, np.arange(first_id, first_id + total, dtype=np.int32), np.cumsum(sentence_lengths))


documents_strategy = st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=30), min_size=2, max_size=6)


def all_instances(docs, config, seed=0):
    counts = InstanceCounts()
    return [inst for i in range(len(docs))
            for inst in create_instances_from_document(docs, i, random.Random(f"{seed}/{i}"), config, counts)]


@settings(max_examples=60, deadline=None)
@given(documents_strategy, st.integers(5, 64), st.integers(0, 1000))
def test_every_instance_fits_and_has_both_segments(lengths, max_seq_length, seed):
    docs = [make_document(f"d{i}", length) for i, length in enumerate(lengths)]
    for inst in all_instances(docs, InstanceConfig(max_seq_length), seed):
        len_a, len_b = inst.a_end - inst.a_start, inst.b_end - inst.b_start
        assert len_a >= 1 and len_b >= 1
        assert len_a + len_b + 3 <= max_seq_length
        assert 0 <= inst.a_start < inst.a_end <= len(docs[inst.a_doc].token_ids)
        assert 0 <= inst.b_start < inst.b_end <= len(docs[inst.b_doc].token_ids)


@settings(max_examples=60, deadline=None)
@given(documents_strategy, st.integers(0, 1000))
def test_random_next_never_comes_from_the_same_document(lengths, seed):
    """The reference's bug: its ten tries could fall back to the same document, labelled random."""
    docs = [make_document(f"d{i}", length) for i, length in enumerate(lengths)]
    for inst in all_instances(docs, InstanceConfig(24), seed):
        if inst.is_random_next:
            assert inst.b_doc != inst.a_doc
        else:
            assert inst.b_doc == inst.a_doc and inst.b_start >= inst.a_end  # its continuation, less any truncation


@settings(max_examples=60, deadline=None)
@given(documents_strategy, st.integers(0, 1000))
def test_without_truncation_each_copy_covers_the_document_in_order(lengths, seed):
    """A and actual-next B spans tile the document exactly: random-next chunks put their unused sentences back."""
    docs = [make_document(f"d{i}", length) for i, length in enumerate(lengths)]
    config = InstanceConfig(max_seq_length=4000, short_seq_prob=0.5)  # never truncates: every span is whole sentences
    for doc_index, doc in enumerate(docs):
        instances = create_instances_from_document(docs, doc_index, random.Random(seed), config, InstanceCounts())
        covered = []
        for inst in instances:
            covered.append((inst.a_start, inst.a_end))
            if not inst.is_random_next:
                covered.append((inst.b_start, inst.b_end))
        assert covered[0][0] == 0 and covered[-1][1] == len(doc.token_ids)
        assert all(prev[1] == nxt[0] for prev, nxt in zip(covered, covered[1:]))
        sentence_starts = {0, *doc.sentence_ends.tolist()}
        assert all(start in sentence_starts and end in sentence_starts for start, end in covered)


def test_one_sentence_chunks_always_take_a_random_next():
    docs = [make_document("a", [50, 50, 50]), make_document("b", [5, 5, 5, 5])]
    instances = create_instances_from_document(docs, 0, random.Random(1), InstanceConfig(40, short_seq_prob=0.0),
                                               InstanceCounts())
    # Every sentence of "a" exceeds the target on its own: each chunk has one sentence, so B must be random.
    assert instances and all(inst.is_random_next and inst.b_doc == 1 for inst in instances)


def test_short_targets_are_drawn_per_document_copy_at_short_seq_prob():
    docs = [make_document(f"d{i}", [10] * 20) for i in range(2)]
    draws = [create_instances_from_document(docs, 0, random.Random(s), InstanceConfig(64, short_seq_prob=0.1),
                                            InstanceCounts())[0].is_short_target for s in range(4000)]
    share = np.mean(draws)
    assert abs(share - 0.1) < 4 * np.sqrt(0.1 * 0.9 / 4000)  # 4 standard errors


def test_a_bucket_of_one_document_counts_chunks_it_cannot_pair():
    """One-sentence chunks need a random B: the first and last sentences are a sequence apart and pair with each
    other; the middle one has no place far enough, so it makes no instance and is counted."""
    counts = InstanceCounts()
    instances = create_instances_from_document([make_document("only", [30, 30, 30])], 0, random.Random(0),
                                               InstanceConfig(20, short_seq_prob=0.0), counts)
    assert all(i.is_random_next and {i.a_start // 30, i.b_start // 30} == {0, 2} for i in instances)
    assert len(instances) == 2 and counts.chunks_without_random_document == 1
    assert counts.random_next_from_same_document == 2


def reference_truncation(len_a, len_b, max_num_tokens, rng):
    """google-research/bert's truncate_seq_pair, token by token, on counts:
    returns (front_a, back_a, front_b, back_b)."""
    removed = {"a": [0, 0], "b": [0, 0]}
    while len_a + len_b > max_num_tokens:
        side = "a" if len_a > len_b else "b"
        removed[side][0 if rng.random() < 0.5 else 1] += 1
        if side == "a":
            len_a -= 1
        else:
            len_b -= 1
    return removed["a"] + removed["b"]


@pytest.mark.parametrize("len_a,len_b,max_tokens", [(100, 5, 60), (5, 100, 60), (70, 70, 61), (40, 39, 60), (3, 3, 10)])
def test_truncation_removes_what_the_reference_removes_with_the_same_front_back_distribution(len_a, len_b, max_tokens):
    ours, theirs = [], []
    for seed in range(3000):
        a0, a1, b0, b1 = _truncate_pair(1000, 1000 + len_a, 5000, 5000 + len_b, max_tokens, random.Random(seed))
        ours.append((a0 - 1000, 1000 + len_a - a1, b0 - 5000, 5000 + len_b - b1))
        theirs.append(tuple(reference_truncation(len_a, len_b, max_tokens, random.Random(seed))))
    ours, theirs = np.array(ours), np.array(theirs)
    # The number removed from each side is deterministic and identical ...
    assert (ours[:, 0] + ours[:, 1] == theirs[:, 0] + theirs[:, 1]).all()
    assert (ours[:, 2] + ours[:, 3] == theirs[:, 2] + theirs[:, 3]).all()
    # ... and the front/back split has the same (binomial) mean and spread.
    for column in range(4):
        assert abs(ours[:, column].mean() - theirs[:, column].mean()) < 0.15 + 0.05 * theirs[:, column].mean()
        assert abs(ours[:, column].std() - theirs[:, column].std()) < 0.15 + 0.1 * theirs[:, column].std()


def test_a_huge_sentence_is_truncated_in_constant_time():
    docs = [make_document("huge", [2_000_000]), make_document("small", [10, 10])]
    instances = create_instances_from_document(docs, 0, random.Random(0), InstanceConfig(128), InstanceCounts())
    assert len(instances) == 1
    inst = instances[0]
    assert (inst.a_end - inst.a_start) + (inst.b_end - inst.b_start) == 125


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=200), st.integers(8, 64), st.integers(0, 1000))
def test_a_lone_document_takes_random_b_far_from_a_in_itself(lengths, max_seq_length, seed):
    """A bucket of one document: a random B comes from its own text, at least a whole sequence from A."""
    doc = make_document("only", lengths)
    counts = InstanceCounts()
    made = create_instances_from_document([doc], 0, random.Random(seed), InstanceConfig(max_seq_length), counts)
    min_distance = max_seq_length - 3
    for inst in made:
        assert inst.b_doc == inst.a_doc == 0
        if inst.is_random_next:
            assert inst.b_end <= inst.a_start - min_distance or inst.b_start >= inst.a_end + min_distance
    assert counts.random_next_from_same_document == sum(inst.is_random_next for inst in made)


def test_a_lone_long_document_keeps_the_reference_random_next_share():
    rng = np.random.default_rng(0)
    doc = make_document("book", rng.integers(5, 40, size=4000).tolist())
    counts = InstanceCounts()
    made = [inst for copy in range(5) for inst in create_instances_from_document(
        [doc], 0, random.Random(copy), InstanceConfig(128), counts)]
    share = np.mean([inst.is_random_next for inst in made])
    assert 0.45 < share < 0.6
    assert counts.chunks_without_random_document == 0


def test_a_lone_short_document_counts_the_chunks_without_random_b():
    doc = make_document("short", [10] * 12)   # 120 tokens: no place a sequence (61 tokens) away from any chunk
    counts = InstanceCounts()
    made = [inst for seed in range(20) for inst in create_instances_from_document(
        [doc], 0, random.Random(seed), InstanceConfig(64, short_seq_prob=0), counts)]
    assert made and not any(inst.is_random_next for inst in made)
    assert counts.chunks_without_random_document > 0 and counts.random_next_from_same_document == 0
