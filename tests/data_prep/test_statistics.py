"""Statistics against the reference (google-research/bert create_pretraining_data.py) on the six books.

The reference's figures on these books (pre-split into sentences, bert-base-uncased vocabulary, seq 128,
dupe_factor 5): 42,316 instances, 4.64 M output tokens, so a mean length of 109.65.

Why the tolerances are what they are: the target length is drawn once per document and copy, and six books
times five copies is only 30 draws, each deciding thousands of instances. So a single run of the reference
(or of us) is one draw from a wide distribution: over 40 seeds we measured a mean length of 119.5 +- 5.2
tokens and 37,485 +- 2,173 instances. The test samples our distribution over seeds and requires the reference's
figures to be plausible draws from it (within 3 standard deviations). The masked share, by contrast, is
fixed by the lengths (min(20, max(1, round(0.15 n))) / n per instance), so it is checked exactly.
"""
import numpy as np
import pytest

from data_prep.documents import Document
from data_prep.instances import InstanceConfig
from data_prep.masking import MaskingConfig, MaskingVocab, num_to_predict
from data_prep.readers import read_documents
from data_prep.shards import ShardSettings, build_shard
from data_prep.stats import InstanceStats
from data_prep.tokenization import WordPieceEncoder, tokenize_document
from data_prep.vocab import SPECIAL_TOKENS

REFERENCE_INSTANCES = 42316
REFERENCE_MEAN_LENGTH = 4.64e6 / 42316
SEEDS = range(12)


@pytest.fixture(scope="module")
def runs(shared_data, bert_vocab):
    encoder = WordPieceEncoder(bert_vocab, lowercase=True)
    documents = [tokenize_document(item, encoder)
                 for path in sorted((shared_data / "corpora" / "books").glob("*.txt"))
                 for item in read_documents(str(path), "books", path.name) if isinstance(item, Document)]
    results = []
    for seed in SEEDS:
        settings = ShardSettings(InstanceConfig(128), MaskingConfig(0.15, 20), "static", 5, seed,
                                 bert_vocab.index("[CLS]"), bert_vocab.index("[SEP]"),
                                 MaskingVocab.from_tokens(bert_vocab, set(SPECIAL_TOKENS)), len(bert_vocab))
        stats = InstanceStats()
        lengths = np.concatenate([batch.num_tokens for batch in build_shard(documents, 0, settings, stats)])
        results.append((stats, lengths))
    return results


def test_instance_count_and_mean_length_are_those_of_the_reference(runs):
    instances = np.array([stats.instances for stats, _ in runs])
    mean_length = np.array([stats.summary()["mean_instance_length"] for stats, _ in runs])
    assert abs(REFERENCE_INSTANCES - instances.mean()) < 3 * instances.std(), (instances.mean(), instances.std())
    assert abs(REFERENCE_MEAN_LENGTH - mean_length.mean()) < 3 * mean_length.std(), (mean_length.mean(),
                                                                                     mean_length.std())


def test_masked_share_is_exactly_the_reference_formula(runs):
    for stats, lengths in runs:
        expected = num_to_predict(lengths, MaskingConfig(0.15, 20)).sum() / lengths.sum()
        assert stats.masked_tokens / stats.tokens == pytest.approx(expected, abs=1e-12)
        assert 0.148 < stats.summary()["masked_token_share"] < 0.150


def test_nsp_balance_is_half_plus_the_single_sentence_chunks(runs):
    """P(random) = 0.5 + 0.5 * P(one-sentence chunk); such chunks come almost only from short targets."""
    for stats, _ in runs:
        summary = stats.summary()
        standard_error = np.sqrt(0.25 / stats.instances)
        assert summary["random_next_share"] > 0.5 - 4 * standard_error
        assert summary["random_next_share"] < 0.5 + 0.5 * summary["short_target_share"] + 0.02 + 4 * standard_error
    # Averaged over seeds the short-target share is about short_seq_prob weighted by the extra instances a
    # short target makes (each is about half as long): 0.1 * 2 / (0.9 + 0.1 * 2) = 0.18, loosely.
    assert 0.05 < np.mean([stats.summary()["short_target_share"] for stats, _ in runs]) < 0.35
