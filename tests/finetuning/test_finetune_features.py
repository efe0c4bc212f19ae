"""Featurizing task rows and batching them: the reference's truncation, padding to the batch's longest, sampling."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from pipeline.finetuning.batches import FeatureRows, LengthGroupedSampler, PaddingCollator, by_length
from pipeline.finetuning.features import encode_pair, multiple_choice_features, sentence_features, truncated_lengths
from pipeline.finetuning.tokenizer import load_tokenizer

BUNDLED_VOCAB = Path(__file__).resolve().parents[2] / "data_prep" / "vocab" / "bert-base-uncased-vocab.txt"


def reference_truncate_seq_pair(len_a: int, len_b: int, max_length: int) -> tuple[int, int]:
    """google-research/bert run_classifier.py _truncate_seq_pair, on lengths."""
    while len_a + len_b > max_length:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


@given(st.integers(0, 300), st.integers(0, 300), st.integers(1, 256))
@example(5, 5, 7)
@example(4, 10, 7)
@example(10, 3, 7)
def test_truncated_lengths_equal_the_reference_loop(len_a, len_b, budget):
    assert truncated_lengths(len_a, len_b, budget) == reference_truncate_seq_pair(len_a, len_b, budget)


def test_encode_pair_layout_and_count():
    ids, types, cut = encode_pair([10, 11, 12, 13, 14], [20, 21, 22], max_seq_length=8, cls_id=2, sep_id=3)
    # budget 5: a shrinks to 3 (= len b), then b to 2, a keeps the odd token
    assert ids == [2, 10, 11, 12, 3, 20, 21, 3]
    assert types == [0, 0, 0, 0, 0, 1, 1, 1]
    assert cut == 3
    ids, types, cut = encode_pair([10, 11, 12], None, max_seq_length=4, cls_id=2, sep_id=3)
    assert ids == [2, 10, 11, 3] and types == [0, 0, 0, 0] and cut == 1


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(BUNDLED_VOCAB, model_vocab_size=30522)


def test_sentence_features_match_bert_tokenization(tokenizer):
    rows = {"text_a": ["The movie was great!", "Is it?"], "text_b": [None, "Yes, it is."], "label": [1, 0],
            "idx": [0, 1]}
    out = sentence_features(rows, tokenizer, max_seq_length=128)
    vocab = tokenizer.tokenizer.get_vocab()
    assert out["input_ids"][0] == [vocab[t] for t in ["[CLS]", "the", "movie", "was", "great", "!", "[SEP]"]]
    assert out["token_type_ids"][1] == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert out["length"] == [7, 11] and out["tokens_cut"] == [0, 0]


def test_a_pair_whose_second_text_has_no_tokens_is_a_single_sentence(tokenizer):
    """As run_classifier.py: `if tokens_b:` decides, so an empty or blank text_b gives [CLS] a [SEP], cut to
    max_seq_length - 2, not [CLS] a [SEP] [SEP]."""
    text = "a long and quite moving film about the sea"
    pairs = sentence_features({"text_a": [text] * 3, "text_b": ["", "   ", None]}, tokenizer, max_seq_length=6)
    single = sentence_features({"text_a": [text], "text_b": [None]}, tokenizer, max_seq_length=6)
    vocab = tokenizer.tokenizer.get_vocab()
    assert single["input_ids"][0] == [vocab[t] for t in ["[CLS]", "a", "long", "and", "quite", "[SEP]"]]
    assert pairs["input_ids"] == single["input_ids"] * 3
    assert pairs["token_type_ids"] == [[0] * 6] * 3 and pairs["tokens_cut"] == [5] * 3


def test_a_tokenizer_json_splits_long_words_as_the_reference(tokenizer, tmp_path):
    """Hugging Face's tokenizer.json files say max_input_chars_per_word 100; the reference splits words of up to 200
    characters into pieces, and so does fine-tuning whatever the file says."""
    from data_prep.vocab import build_tokenizer, parse_vocab

    hub_like = build_tokenizer(parse_vocab(BUNDLED_VOCAB.read_text(encoding="utf-8")), lowercase=True)
    hub_like.model.max_input_chars_per_word = 100
    hub_like.save(str(tmp_path / "tokenizer.json"))
    loaded = load_tokenizer(tmp_path, model_vocab_size=30522)
    word = ("international" * 12)[:150]
    assert loaded.encode([word]) == tokenizer.encode([word])
    assert tokenizer.encode([word])[0] != [tokenizer.tokenizer.token_to_id("[UNK]")]


def test_multiple_choice_features_one_pair_per_ending(tokenizer):
    rows = {"context": ["He opens the door."], "start": ["He"], "endings": [["walks in.", "sleeps.", "a", "b c"]],
            "label": [0], "idx": [0]}
    out = multiple_choice_features(rows, tokenizer, max_seq_length=128)
    assert len(out["input_ids"][0]) == 4
    vocab = tokenizer.tokenizer.get_vocab()
    second = out["input_ids"][0][1]
    assert second == [vocab[t] for t in ["[CLS]", "he", "opens", "the", "door", ".", "[SEP]", "he", "sleeps", ".",
                                         "[SEP]"]]
    assert out["length"] == [max(map(len, out["input_ids"][0]))]


def test_collator_pads_to_the_longest_and_masks_padding():
    rows = [{"input_ids": [2, 5, 3], "token_type_ids": [0, 0, 0], "label": 1, "row": 4},
            {"input_ids": [2, 5, 6, 7, 3], "token_type_ids": [0, 0, 0, 1, 1], "label": 0, "row": 0}]
    batch = PaddingCollator(pad_id=0)(rows)
    assert batch["input_ids"].tolist() == [[2, 5, 3, 0, 0], [2, 5, 6, 7, 3]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 0, 0], [0, 0, 0, 1, 1]]
    assert batch["labels"].tolist() == [1, 0] and batch["row"].tolist() == [4, 0]
    assert PaddingCollator(pad_id=0, pad_to_multiple_of=8)(rows)["input_ids"].shape == (2, 8)


def test_collator_multiple_choice_shape():
    row = {"input_ids": [[2, 3], [2, 5, 3], [2, 3], [2, 6, 7, 3]], "token_type_ids": [[0, 0], [0, 0, 1], [0, 0],
                                                                                     [0, 0, 1, 1]],
           "label": 3, "row": 0}
    batch = PaddingCollator(pad_id=0)([row, row])
    assert batch["input_ids"].shape == (2, 4, 4)
    assert batch["attention_mask"][0, 1].tolist() == [1, 1, 1, 0]


def test_length_grouped_sampler_is_a_seeded_permutation_of_similar_length_batches():
    lengths = np.random.default_rng(0).integers(3, 120, size=5000)
    sampler = LengthGroupedSampler(lengths, batch_size=32, seed=7)
    order = list(sampler)
    assert sorted(order) == list(range(5000))
    assert order == list(LengthGroupedSampler(lengths, batch_size=32, seed=7))
    sampler.set_epoch(1)
    assert list(sampler) != order
    padded = sum(32 * lengths[order[i:i + 32]].max() for i in range(0, 5000, 32))
    random_padded = sum(32 * lengths[i:i + 32].max() for i in range(0, 5000, 32))
    assert padded < 0.7 * random_padded


def test_evaluation_order_is_shortest_first():
    assert by_length(np.array([5, 2, 9, 2])) == [1, 3, 0, 2]


def test_token_labels_are_padded_with_the_ignored_label():
    import datasets
    features = datasets.Dataset.from_dict({"input_ids": [[2, 7, 3], [2, 7, 8, 9, 3]],
                                           "token_type_ids": [[0] * 3, [0] * 5],
                                           "length": [3, 5], "label": [[-100, 1, -100], [-100, 2, -100, 3, -100]]})
    rows = FeatureRows(features, kind="token")
    batch = PaddingCollator(0)([rows[0], rows[1]])
    assert batch["labels"].tolist() == [[-100, 1, -100, -100, -100], [-100, 2, -100, 3, -100]]


def test_span_labels_are_start_end_pairs():
    import datasets
    features = datasets.Dataset.from_dict({"input_ids": [[2, 7, 3, 8, 3]], "token_type_ids": [[0, 0, 0, 1, 1]],
                                           "length": [5], "label": [[3, 3]]})
    assert PaddingCollator(0)([FeatureRows(features, kind="span")[0]])["labels"].tolist() == [[3, 3]]


def test_feature_rows_regression_labels_are_float():
    import datasets
    features = datasets.Dataset.from_dict({"input_ids": [[2, 3]], "token_type_ids": [[0, 0]], "length": [2],
                                           "label": [3.5], "idx": [0]})
    rows = FeatureRows(features, kind="regression")
    assert rows[0]["label"] == np.float32(3.5)
    assert PaddingCollator(0)([rows[0]])["labels"].dtype == torch.float32
