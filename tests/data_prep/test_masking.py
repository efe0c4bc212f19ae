"""Masking: exact counts, never special tokens, 80/10/10, whole words, and batch independence."""
import numpy as np
import pytest

from data_prep.masking import MaskingConfig, MaskingVocab, mask_batch, num_to_predict
from data_prep.vocab import SPECIAL_TOKENS

CLS, SEP = 101, 102


def make_rows(rng, n_rows, width=128, vocab_low=1000, vocab_high=30000):
    num_tokens = rng.integers(6, width + 1, size=n_rows)
    num_a = np.array([rng.integers(1, n - 3) if n > 4 else 1 for n in num_tokens])
    ids = np.zeros((n_rows, width), dtype=np.int32)
    for i, (n, a) in enumerate(zip(num_tokens, num_a)):
        ids[i, :n] = rng.integers(vocab_low, vocab_high, size=n)
        ids[i, 0], ids[i, a + 1], ids[i, n - 1] = CLS, SEP, SEP
    return ids, num_tokens, num_a


@pytest.fixture(scope="module")
def vocab(bert_vocab):
    return MaskingVocab.from_tokens(bert_vocab, set(SPECIAL_TOKENS))


@pytest.mark.parametrize("n,expected", [(4, 1), (10, 2), (30, 4), (50, 8), (128, 19), (140, 20)])
def test_num_to_predict_rounds_half_to_even_and_caps(n, expected):
    # 10 * .15 = 1.5 -> 2 and 30 * .15 = 4.5 -> 4 (Python's round, as in the reference); 140 -> 21 capped at 20.
    assert num_to_predict(np.array([n]), MaskingConfig(0.15, 20))[0] == expected


def test_exact_count_never_special_sorted_and_labels_are_originals(vocab):
    rng = np.random.default_rng(0)
    ids, num_tokens, num_a = make_rows(rng, 500)
    config = MaskingConfig(0.15, 20)
    out = mask_batch(ids, num_tokens, num_a, rng.integers(0, 2**63, size=500, dtype=np.uint64), config, vocab)
    expected = np.minimum(num_to_predict(num_tokens, config), num_tokens - 3)
    assert (out.num_masked == expected).all()
    for i in range(500):
        positions = out.positions[i, : out.num_masked[i]]
        assert (np.diff(positions) > 0).all()
        assert not set(positions) & {0, num_a[i] + 1, num_tokens[i] - 1}
        assert (out.labels[i, : out.num_masked[i]] == ids[i, positions]).all()
        untouched = np.setdiff1d(np.arange(128), positions)
        assert (out.input_ids[i, untouched] == ids[i, untouched]).all()
        assert (out.positions[i, out.num_masked[i]:] == 0).all()
    assert (ids[:, 0] == CLS).all()  # the input is not modified


def test_replacement_shares_are_80_10_10(vocab):
    rng = np.random.default_rng(1)
    ids, num_tokens, num_a = make_rows(rng, 4000)
    out = mask_batch(ids, num_tokens, num_a, rng.integers(0, 2**63, size=4000, dtype=np.uint64),
                     MaskingConfig(0.15, 20), vocab)
    rows, slots = np.nonzero(np.arange(20)[None, :] < out.num_masked[:, None])
    positions = out.positions[rows, slots]
    new, old = out.input_ids[rows, positions], out.labels[rows, slots]
    total = len(rows)
    shares = {"mask": np.mean(new == vocab.mask_id), "same": np.mean(new == old),
              "random": np.mean((new != vocab.mask_id) & (new != old))}
    se = np.sqrt(0.1 * 0.9 / total)
    assert abs(shares["mask"] - 0.8) < 5 * se and abs(shares["random"] - 0.1) < 5 * se
    # A random replacement may draw the original token: "same" is 10% plus that small chance.
    assert abs(shares["same"] - 0.1) < 5 * se + 0.01
    assert not np.isin(new[new != old], [0, 100, CLS, SEP]).any()  # never [PAD]/[UNK]/[CLS]/[SEP] as a replacement


def test_a_row_is_masked_the_same_alone_or_in_any_batch(vocab):
    rng = np.random.default_rng(2)
    ids, num_tokens, num_a = make_rows(rng, 64)
    seeds = rng.integers(0, 2**63, size=64, dtype=np.uint64)
    together = mask_batch(ids, num_tokens, num_a, seeds, MaskingConfig(), vocab)
    for i in (0, 17, 63):
        alone = mask_batch(ids[i:i + 1], num_tokens[i:i + 1], num_a[i:i + 1], seeds[i:i + 1], MaskingConfig(), vocab)
        assert (alone.input_ids[0] == together.input_ids[i]).all()
        assert (alone.positions[0] == together.positions[i]).all()


def test_masking_is_uniform_over_candidate_positions(vocab):
    n_rows = 6000
    ids = np.full((n_rows, 12), 2000, dtype=np.int32)
    ids[:, 0], ids[:, 5], ids[:, 11] = CLS, SEP, SEP
    out = mask_batch(ids, np.full(n_rows, 12), np.full(n_rows, 4), np.arange(n_rows, dtype=np.uint64),
                     MaskingConfig(0.15, 20), vocab)
    counts = np.bincount(out.positions[:, 0][out.num_masked > 0], minlength=12)  # 12 * .15 = 1.8 -> 2 per row
    hits = np.zeros(12)
    for k in range(2):
        hits += np.bincount(out.positions[:, k], minlength=12)
    candidate_hits = hits[[1, 2, 3, 4, 6, 7, 8, 9, 10]]
    assert hits[[0, 5, 11]].sum() == 0 and counts.sum() == n_rows
    expected = n_rows * 2 / 9
    assert np.all(np.abs(candidate_hits - expected) < 5 * np.sqrt(expected))


def test_whole_word_masking_takes_whole_words(bert_vocab, vocab):
    piece = {t: i for i, t in enumerate(bert_vocab)}
    words = [["the"], ["token", "##ization"], ["story"], ["em", "##bed", "##ding"], ["is"], ["playful", "##ness"]] * 3
    a_tokens = [p for w in words for p in w]
    row = [CLS] + [piece[p] for p in a_tokens] + [SEP] + [piece["ok"]] + [SEP]
    n_rows = 300
    ids = np.tile(np.array(row, dtype=np.int32), (n_rows, 1))
    out = mask_batch(ids, np.full(n_rows, len(row)), np.full(n_rows, len(a_tokens)),
                     np.arange(n_rows, dtype=np.uint64), MaskingConfig(0.15, 20, whole_word_masking=True), vocab)
    budget = num_to_predict(np.array([len(row)]), MaskingConfig(0.15, 20))[0]
    word_of_position, position = {}, 1
    for w_index, word in enumerate(words):
        for _ in word:
            word_of_position[position] = w_index
            position += 1
    for i in range(n_rows):
        chosen = set(out.positions[i, : out.num_masked[i]].tolist())
        assert out.num_masked[i] <= budget
        for p in chosen - {len(a_tokens) + 2}:
            word_positions = {q for q, w in word_of_position.items() if w == word_of_position[p]}
            assert word_positions <= chosen
    assert np.mean(out.num_masked == budget) > 0.5  # usually fills the budget exactly, as the reference does
