"""CoNLL features: each word's label on its first WordPiece and -100 everywhere else, with BERT's real cased and
uncased vocabularies; truncation counted; document context placed around the sentence, unlabelled."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import datasets  # noqa: E402
import pytest  # noqa: E402

from pipeline.finetuning.tasks import get_task  # noqa: E402
from pipeline.finetuning.tasks.conll import LABELS, context_sizes, ner_features, read_conll  # noqa: E402
from pipeline.finetuning.tokenizer import load_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VOCABS = REPO / "data_prep" / "vocab"
FIXTURES = Path(__file__).parent / "fixtures" / "conll2003"
LABEL_ID = {label: i for i, label in enumerate(LABELS)}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hf_datasets_cache")


@pytest.fixture(scope="module")
def uncased():
    return load_tokenizer(VOCABS / "bert-base-uncased-vocab.txt", 30522)


@pytest.fixture(scope="module")
def cased(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cased")
    shutil.copy(VOCABS / "bert-base-cased-vocab.txt", directory / "vocab.txt")
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    tokenizer = load_tokenizer(directory, 28996)
    assert not tokenizer.lowercase
    return tokenizer


@pytest.fixture(scope="module")
def sentences(cache):
    return read_conll(FIXTURES / "eng.train", cache_dir=cache)


def tokens(tokenizer, ids):
    return [tokenizer.tokenizer.id_to_token(i) for i in ids]


def sentence_dataset(docs: list[int], texts: list[str]) -> datasets.Dataset:
    """Sentences of single-piece words, every word tagged O except a first word "Paris" (B-LOC)."""
    words = [text.split() for text in texts]
    return datasets.Dataset.from_dict({
        "idx": list(range(len(texts))), "doc_index": docs, "words": words,
        "labels": [["B-LOC" if w == "Paris" else "O" for w in sentence] for sentence in words]})


# -- first sub-token alignment -------------------------------------------------------------------------------------


def test_first_piece_carries_the_label(uncased, sentences):
    features, report = ner_features(sentences, uncased, LABELS, max_seq_length=128)
    first = features[0]
    assert tokens(uncased, first["input_ids"]) == ["[CLS]", "ko", "##wal", "##cz", "##yk", "wins", "thessaloniki",
                                                   "marathon", ".", "[SEP]"]
    #                           [CLS]  ko  ##wal ##cz ##yk wins thessaloniki(B-LOC) marathon .  [SEP]
    assert first["label"] == [-100, 1, -100, -100, -100, 0, 5, 0, 0, -100]
    assert first["word_starts"] == [1, 5, 6, 7, 8]
    assert first["token_type_ids"] == [0] * 10 and first["length"] == 10 and first["idx"] == 0
    assert features.column_names == ["idx", "input_ids", "token_type_ids", "length", "label", "word_starts"]
    assert report == {"examples": 8, "features": 8, "words": 82, "words_cut": 0, "examples_truncated": 0,
                      "document_context": False}


@pytest.mark.parametrize("which", ["uncased", "cased"])
def test_alignment_on_every_fixture_word(request, sentences, which):
    tokenizer = request.getfixturevalue(which)
    features, _ = ner_features(sentences, tokenizer, LABELS)
    split_words = 0
    for row, sentence in zip(features, sentences):
        starts, label, pieces = row["word_starts"], row["label"], tokens(tokenizer, row["input_ids"])
        assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]" and len(pieces) == row["length"]
        ends = [*starts[1:], len(pieces) - 1]
        for word, tag, start, end in zip(sentence["words"], sentence["labels"], starts, ends):
            assert label[start] == LABEL_ID[tag]
            assert not pieces[start].startswith("##")
            assert "".join(p.removeprefix("##") for p in pieces[start:end]) == (
                word.lower() if which == "uncased" else word)
            assert all(value == -100 for value in label[start + 1:end])
            split_words += end - start > 1
        assert sum(value != -100 for value in label) == len(sentence["words"])
    assert split_words >= 8   # Kowalczyk, Kiprotich, 1996-10-06, 's, ... really are split


def test_word_without_pieces_becomes_unk(uncased):
    # U+200B (zero-width space) is dropped by BERT's normaliser: the word would have no piece and no prediction
    data = sentence_dataset([0], ["Paris is \u200b here"])
    features, _ = ner_features(data, uncased, LABELS)
    assert tokens(uncased, features[0]["input_ids"]) == ["[CLS]", "paris", "is", "[UNK]", "here", "[SEP]"]
    assert features[0]["word_starts"] == [1, 2, 3, 4]
    assert features[0]["label"] == [-100, LABEL_ID["B-LOC"], 0, 0, 0, -100]


# -- truncation ----------------------------------------------------------------------------------------------------


def test_truncation_is_counted(uncased, sentences):
    features, report = ner_features(sentences, uncased, LABELS, max_seq_length=8)
    # sentence 0 in 6 pieces: ko ##wal ##cz ##yk wins thessaloniki | marathon . -> 2 words cut
    first = features[0]
    assert tokens(uncased, first["input_ids"]) == ["[CLS]", "ko", "##wal", "##cz", "##yk", "wins", "thessaloniki",
                                                   "[SEP]"]
    assert first["word_starts"] == [1, 5, 6, -1, -1]
    assert first["label"] == [-100, 1, -100, -100, -100, 0, 5, -100]
    cut = [sum(s == -1 for s in row) for row in features["word_starts"]]
    assert all(length <= 8 for length in features["length"])
    assert report["words_cut"] == sum(cut) and report["examples_truncated"] == sum(c > 0 for c in cut)
    # all but the datelines: "thessaloniki 1996 - 10 - 06" is 6 pieces; in "ein ##dh ##oven , netherlands 1996 - 10
    # - 06" the date's first piece is the 6th: pieces are cut, no word is
    assert report["examples_truncated"] == 6 and features[5]["word_starts"] == [1, 4, 5, 6]
    # a word whose first piece fits keeps its label though its other pieces are cut
    tiny, tiny_report = ner_features(sentences.select([0]), uncased, LABELS, max_seq_length=4)
    assert tokens(uncased, tiny[0]["input_ids"]) == ["[CLS]", "ko", "##wal", "[SEP]"]
    assert tiny[0]["word_starts"] == [1, -1, -1, -1, -1] and tiny[0]["label"] == [-100, 1, -100, -100]
    assert tiny_report["words_cut"] == 4 and tiny_report["examples_truncated"] == 1


# -- document context ----------------------------------------------------------------------------------------------


def test_context_sizes():
    assert context_sizes(4, 10, 10) == (2, 2)       # half each side
    assert context_sizes(5, 10, 10) == (2, 3)       # the odd piece after the sentence
    assert context_sizes(4, 1, 10) == (1, 3)        # the left has 1: the right takes the rest
    assert context_sizes(4, 10, 1) == (3, 1)
    assert context_sizes(4, 0, 0) == (0, 0)
    assert context_sizes(4, 2, 1) == (2, 1)         # not enough on either side


def test_document_context_centres_the_sentence(uncased):
    data = sentence_dataset([0, 0, 0, 1], ["the cat sat", "Paris is", "on a big mat", "new doc"])
    features, report = ner_features(data, uncased, LABELS, max_seq_length=8, document_context=True)
    rows = [tokens(uncased, ids) for ids in features["input_ids"]]
    # sentence 1 ("paris is", 2 pieces): room 6 - 2 = 4 -> 2 before (the end of "the cat sat"), 2 after
    assert rows[1] == ["[CLS]", "cat", "sat", "paris", "is", "on", "a", "[SEP]"]
    assert features[1]["word_starts"] == [3, 4]
    assert features[1]["label"] == [-100, -100, -100, LABEL_ID["B-LOC"], 0, -100, -100, -100]
    # sentence 0 (3 pieces), first of its document: room 3, all after it
    assert rows[0] == ["[CLS]", "the", "cat", "sat", "paris", "is", "on", "[SEP]"]
    assert features[0]["label"] == [-100, 0, 0, 0, -100, -100, -100, -100]
    # sentence 2 (4 pieces), last of its document (the next sentence is another document's): room 2, all before
    assert rows[2] == ["[CLS]", "paris", "is", "on", "a", "big", "mat", "[SEP]"]
    assert features[2]["word_starts"] == [3, 4, 5, 6]
    # sentence 3, alone in its document: no context
    assert rows[3] == ["[CLS]", "new", "doc", "[SEP]"]
    assert report["document_context"] is True and report["words_cut"] == 0


def test_document_context_takes_whole_words(uncased):
    # "kowalczyk" is 4 pieces (ko ##wal ##cz ##yk): a context of 2 pieces before "is here" cannot hold it
    data = sentence_dataset([0, 0, 0], ["met kowalczyk", "is here", "it was"])
    features, _ = ner_features(data, uncased, LABELS, max_seq_length=8, document_context=True)
    # room 4: 2 before (only part of kowalczyk fits: none taken), 2 after
    assert tokens(uncased, features[1]["input_ids"]) == ["[CLS]", "is", "here", "it", "was", "[SEP]"]
    first = tokens(uncased, features[2]["input_ids"])   # room 4, all before: ##cz ##yk is here -> whole words only
    assert first == ["[CLS]", "is", "here", "it", "was", "[SEP]"]
    for ids in features["input_ids"]:
        assert not tokens(uncased, ids)[1].startswith("##")


def test_document_context_on_the_fixture(uncased, sentences):
    plain, _ = ner_features(sentences, uncased, LABELS, max_seq_length=64)
    context, report = ner_features(sentences, uncased, LABELS, max_seq_length=64, document_context=True)
    assert report["words_cut"] == 0
    for without, with_context in zip(plain, context):
        assert with_context["length"] <= 64 and with_context["length"] >= without["length"]
        # the same pieces at the words' starts, the same labels there, and nothing else labelled
        shift = with_context["word_starts"][0] - without["word_starts"][0]
        assert [s + shift for s in without["word_starts"]] == with_context["word_starts"]
        n = without["length"] - 2
        assert with_context["input_ids"][1 + shift:1 + shift + n] == without["input_ids"][1:1 + n]
        assert [x for x in with_context["label"] if x != -100] == [x for x in without["label"] if x != -100]
    # the 2-word dateline of document 0 gets context from both sides
    assert context[1]["word_starts"][0] > 1 and context[1]["length"] > plain[1]["length"] + 10


def test_bad_input(uncased):
    data = datasets.Dataset.from_dict({"idx": [0], "doc_index": [0], "words": [["Bonn"]], "labels": [["B-CITY"]]})
    with pytest.raises(ValueError, match="sentence 0: label 'B-CITY' is not one of O, B-PER"):
        ner_features(data, uncased, LABELS)
    with pytest.raises(ValueError, match="max_seq_length must be at least 3"):
        ner_features(data, uncased, LABELS, max_seq_length=2)


def test_features_are_cached_by_fingerprint(uncased, sentences):
    first, _ = ner_features(sentences, uncased, LABELS, max_seq_length=32)
    again, _ = ner_features(sentences, uncased, LABELS, max_seq_length=32)
    assert again._fingerprint == first._fingerprint and again.cache_files == first.cache_files
    assert first.cache_files   # on disk, under the reader's cache_dir
    for other in (ner_features(sentences, uncased, LABELS, max_seq_length=16)[0],
                  ner_features(sentences, uncased, LABELS, max_seq_length=32, document_context=True)[0]):
        assert other._fingerprint != first._fingerprint


def test_task_featurize(uncased, sentences):
    task = get_task("conll2003")
    features, report = task.featurize(sentences, uncased, {"max_seq_length": 16, "document_context": True},
                                      training=True)
    expected, expected_report = ner_features(sentences, uncased, LABELS, max_seq_length=16, document_context=True)
    assert features["input_ids"] == expected["input_ids"] and report == expected_report
    assert task.featurize(sentences, uncased, {}, training=False)[1]["document_context"] is False
