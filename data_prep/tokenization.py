"""Document -> sentences -> token ids (WordPiece, or any tokenizer.json), as one flat array per document."""
from __future__ import annotations

import itertools

import numpy as np
from tokenizers import Tokenizer

from data_prep.documents import Document
from data_prep.instances import TokenizedDocument
from data_prep.segmentation import split_paragraphs_into_sentences
from data_prep.vocab import build_tokenizer


class WordPieceEncoder:
    """BERT's tokenizer with a fast path for printable ASCII sentences.

    On printable ASCII, BertNormalizer's work (control-character removal, CJK padding, NFD accent stripping)
    changes nothing but the case, yet its alignment-tracking NFD is most of the tokenizer's time. Such
    sentences are lower-cased by str.lower() and tokenized without a normalizer: the same ids (a property
    test checks it), about 1.8x faster on English text. Everything else takes the full normalizer.
    """

    def __init__(self, vocab_tokens: list[str], lowercase: bool):
        self.full = build_tokenizer(vocab_tokens, lowercase)
        self.ascii_fast = build_tokenizer(vocab_tokens, lowercase)
        self.ascii_fast.normalizer = None
        self.lowercase = lowercase

    def encode(self, sentences: list[str]) -> list[list[int]]:
        simple = [sentence.isascii() and sentence.isprintable() for sentence in sentences]
        if all(simple):
            return self._encode_ascii(sentences)
        fast_ids = iter(self._encode_ascii([s for s, ok in zip(sentences, simple) if ok]))
        full_ids = iter(_encode(self.full, [s for s, ok in zip(sentences, simple) if not ok]))
        return [next(fast_ids) if ok else next(full_ids) for ok in simple]

    def _encode_ascii(self, sentences: list[str]) -> list[list[int]]:
        return _encode(self.ascii_fast, [s.lower() for s in sentences] if self.lowercase else sentences)


class TokenizerJsonEncoder:
    """Any tokenizer.json (ModernBERT's byte-level BPE, ...), without its special tokens: data_prep adds [CLS] and
    [SEP] where a row needs them."""

    def __init__(self, tokenizer_json: str):
        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        # Corpus text that spells a special token stays text (as for WordPiece), and no sentence is cut or padded.
        self.tokenizer.encode_special_tokens = True
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()

    def encode(self, sentences: list[str]) -> list[list[int]]:
        # A document's sentences are running text: each after the first follows a space, which byte-level BPE and
        # SentencePiece models encode into the word's first token ('ĠThe', '▁The'), as they do inside a text.
        return _encode(self.tokenizer, sentences[:1] + [" " + sentence for sentence in sentences[1:]])


def _encode(tokenizer: Tokenizer, sentences: list[str]) -> list[list[int]]:
    # encode_batch_fast skips offset tracking, which we do not need.
    return [encoding.ids for encoding in tokenizer.encode_batch_fast(sentences, add_special_tokens=False)]


def document_sentences(document: Document) -> list[str]:
    if document.presplit:
        return [line for line in document.paragraphs if line.strip()]
    return split_paragraphs_into_sentences(document.paragraphs)


def sentences_within(sentences: list[str], max_chars: int) -> tuple[list[str], list[int]]:
    """The sentences of at most ``max_chars`` characters, and the lengths of the others.

    Readers bound lines, but a sentence can be longer: joined from a book's or a record's lines with no blank line or
    sentence end among them. Handed to tokenizers whole, one costs ~16 bytes per byte (data_prep.readers._io).
    """
    if all(len(sentence) <= max_chars for sentence in sentences):
        return sentences, []
    return ([sentence for sentence in sentences if len(sentence) <= max_chars],
            [len(sentence) for sentence in sentences if len(sentence) > max_chars])


def tokenize_document(document: Document, encoder: WordPieceEncoder | TokenizerJsonEncoder
                      ) -> TokenizedDocument | None:
    """The document's sentences as ids; sentences that tokenize to nothing are dropped; None if all do."""
    return tokenize_sentences(document.key, document_sentences(document), encoder)


def tokenize_sentences(key: str, sentences: list[str], encoder: WordPieceEncoder | TokenizerJsonEncoder
                       ) -> TokenizedDocument | None:
    """A document's sentences (``document_sentences``) as ids; as ``tokenize_document``."""
    ids = encoder.encode(sentences)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    total = int(lengths.sum())
    if total == 0:
        return None
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=total)
    return TokenizedDocument(key, flat, np.cumsum(lengths[lengths > 0]))
