"""Tokenization: the ASCII fast path gives exactly the full BERT tokenizer's ids, and words split as the reference's."""
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep.documents import Document
from data_prep.tokenization import WordPieceEncoder, tokenize_document
from data_prep.vocab import build_tokenizer, parse_vocab, train_vocab

printable_ascii = st.text(alphabet=string.printable.replace("\n", "").replace("\r", ""), max_size=200)
any_text = st.text(max_size=120)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(printable_ascii, any_text), min_size=1, max_size=8))
def test_fast_path_ids_equal_full_tokenizer_ids(bert_vocab, sentences):
    encoder = WordPieceEncoder(bert_vocab, lowercase=True)
    full = build_tokenizer(bert_vocab, lowercase=True)
    expected = [e.ids for e in full.encode_batch(sentences, add_special_tokens=False)]
    assert encoder.encode(sentences) == expected


def test_fast_path_on_a_real_book_equals_full_tokenizer(bert_vocab, shared_data):
    text = (shared_data / "corpora" / "books" / "austen-persuasion.txt").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()][:3000]
    for lowercase in (True, False):
        encoder = WordPieceEncoder(bert_vocab, lowercase=lowercase)
        full = build_tokenizer(bert_vocab, lowercase=lowercase)
        assert encoder.encode(lines) == [e.ids for e in full.encode_batch(lines, add_special_tokens=False)]


def test_special_token_text_is_not_a_special_token(bert_vocab):
    encoder = WordPieceEncoder(bert_vocab, lowercase=True)
    ids = encoder.encode(["he wrote [SEP] and [MASK] here", "accented [MASK] café"])
    assert all(bert_vocab.index(t) not in row for row in ids for t in ("[SEP]", "[MASK]"))


def test_document_is_split_into_sentences_and_empty_ones_dropped(bert_vocab):
    encoder = WordPieceEncoder(bert_vocab, lowercase=True)
    doc = Document("d:0", ("The cat sat. It was happy!", "\u200b", "A new paragraph here."))
    tokenized = tokenize_document(doc, encoder)
    assert len(tokenized.sentence_ends) == 3
    assert tokenized.sentence_ends[-1] == len(tokenized.token_ids)
    assert tokenize_document(Document("d:1", ("\u200b\u200b",)), encoder) is None


def test_presplit_documents_keep_their_lines_as_sentences(bert_vocab):
    encoder = WordPieceEncoder(bert_vocab, lowercase=True)
    doc = Document("d:0", ("One line. With two sentences.", "Another."), presplit=True)
    assert len(tokenize_document(doc, encoder).sentence_ends) == 2


def test_trained_vocabulary_has_specials_first_and_round_trips():
    texts = ["the quick brown fox jumps over the lazy dog"] * 50 + ["pack my box with five dozen liquor jugs"] * 50
    tokens = train_vocab(texts, vocab_size=200, lowercase=True, min_frequency=2)
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert parse_vocab("".join(t + "\n" for t in tokens)) == tokens
    ids = WordPieceEncoder(tokens, lowercase=True).encode(["The quick fox"])[0]
    assert [tokens[i] for i in ids][:2] == ["the", "quick"]


def test_sentences_never_span_paragraphs_and_the_mark_in_text_is_handled():
    from data_prep.segmentation import split_paragraphs_into_sentences
    paragraphs = ("CHAPTER I", "It was a dark night. The rain fell.", "He met Mr. Smith")
    assert split_paragraphs_into_sentences(paragraphs) == [
        "CHAPTER I", "It was a dark night.", "The rain fell.", "He met Mr. Smith"]
    with_mark = ("odd \ue000 char here. Next one.", "Second paragraph")
    assert split_paragraphs_into_sentences(with_mark) == ["odd \ue000 char here.", "Next one.", "Second paragraph"]


def reference_wordpiece(word: str, vocab: set[str], max_input_chars_per_word: int = 200) -> list[str]:
    """google-research/bert tokenization.py, WordpieceTokenizer.tokenize on one whitespace-free word: greedy
    longest-match-first, continuation pieces prefixed ##, the whole word one [UNK] when it is too long or a piece
    cannot be matched."""
    if len(word) > max_input_chars_per_word:
        return ["[UNK]"]
    pieces, start = [], 0
    while start < len(word):
        end, piece = len(word), None
        while start < end:
            candidate = ("##" if start else "") + word[start:end]
            if candidate in vocab:
                piece = candidate
                break
            end -= 1
        if piece is None:
            return ["[UNK]"]
        pieces.append(piece)
        start = end
    return pieces


@pytest.mark.parametrize("length", [99, 100, 101, 150, 200, 201, 300])
def test_long_words_split_as_the_reference(bert_vocab, length):
    word = ("internationalization" * 20)[:length]
    encoder = WordPieceEncoder(bert_vocab, lowercase=True)
    pieces = [bert_vocab[i] for i in encoder.encode([word])[0]]
    assert pieces == reference_wordpiece(word, set(bert_vocab))
    assert (pieces == ["[UNK]"]) is (length > 200)
