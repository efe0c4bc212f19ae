"""CoNLL sentences -> token-classification features: one feature per sentence, the label of each word on its first
WordPiece (the BERT paper's choice, section 5.3), -100 on every other position ([CLS], [SEP], a word's later pieces,
document context), which the loss and the evaluation ignore.

The words are tokenised as given (``is_pretokenized``: the tokenizer never merges two words, and splits a word only
where BERT's pre-tokeniser would, on punctuation, which keeps the pieces of one word together). A word that yields
no piece at all (only characters BERT's normaliser drops, such as a zero-width space) becomes ``[UNK]``, so every
word has a first piece and a prediction.

A sentence longer than ``max_seq_length - 2`` pieces is cut at the end; a word whose first piece is cut gets
``word_starts`` -1, is counted in the report (``words_cut``) and is predicted ``O`` at evaluation.

``document_context=True`` (the paper's "maximal document context"): the sentence's room left in the sequence is
filled with the pieces of the neighbouring sentences of its document (the end of the preceding ones, the start of the
following ones), unlabelled, so the sentence sits in the middle: half the room each side, the other side taking what
one side cannot use; then each side is trimmed to whole words (a context never starts or ends inside a word), so it
may fall short of the room by part of a word. No separator is put between sentences; all segment ids are 0.
Neighbours are the rows of the dataset given (in its order, same ``doc_index``).
"""
from __future__ import annotations

from typing import Any

import datasets

from model.shared.outputs import IGNORE_INDEX
from pipeline.finetuning.fingerprint import cache_key, code_digest

CUT = -1   # word_starts of a word whose first piece did not fit

FEATURES = datasets.Features({
    "idx": datasets.Value("int64"),
    "input_ids": datasets.List(datasets.Value("int32")),
    "token_type_ids": datasets.List(datasets.Value("int8")),
    "length": datasets.Value("int32"),
    "label": datasets.List(datasets.Value("int64")),         # per token: a label id, or -100
    "word_starts": datasets.List(datasets.Value("int32")),   # per word: its first piece's position, or -1 if cut
})

_CODE_DIGEST = code_digest(__file__)


def ner_features(sentences: datasets.Dataset, tokenizer, label_list, max_seq_length: int = 128,
                 document_context: bool = False) -> tuple[datasets.Dataset, dict[str, Any]]:
    """Features of the sentences (columns ``idx``, ``doc_index``, ``words``, ``labels`` as ``read_conll`` gives
    them) -> (features, report); see :data:`FEATURES` and :func:`ner_report`. ``tokenizer``: a
    ``pipeline.finetuning.tokenizer.LoadedTokenizer``. Cached by ``datasets`` under a fingerprint of the
    sentences, the tokenizer, the labels, the settings and this module's code."""
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be at least 3 ([CLS] word [SEP]), got {max_seq_length}")
    label_list = tuple(label_list)
    unk_id = tokenizer.tokenizer.token_to_id("[UNK]")
    fingerprint = cache_key(sentences._fingerprint, tokenizer.fingerprint, label_list, max_seq_length,
                            bool(document_context), _CODE_DIGEST)
    features = sentences.map(
        _featurize, batched=True,
        batch_size=None if document_context else 1000,   # context: the whole split is one batch (neighbours)
        fn_kwargs={"tokenizer": tokenizer.word_tokenizer, "cls_id": tokenizer.cls_id, "sep_id": tokenizer.sep_id,
                   "unk_id": unk_id, "label_ids": {label: i for i, label in enumerate(label_list)},
                   "max_seq_length": max_seq_length, "document_context": bool(document_context)},
        remove_columns=sentences.column_names, features=FEATURES, new_fingerprint=fingerprint,
        desc="CoNLL features")
    return features, ner_report(features, document_context)


def ner_report(features: datasets.Dataset, document_context: bool = False) -> dict[str, Any]:
    """Counts for the run's report: sentences (``examples``), ``words``, ``words_cut`` (first piece past
    max_seq_length: predicted O) and ``examples_truncated`` (sentences with a word cut)."""
    starts = column(features, "word_starts")
    cut = [sum(1 for s in row if s < 0) for row in starts]
    return {"examples": len(starts), "features": len(starts), "words": sum(map(len, starts)),
            "words_cut": sum(cut), "examples_truncated": sum(1 for c in cut if c), "document_context":
            bool(document_context)}


def column(data: datasets.Dataset, name: str) -> list:
    """A column as a list, read at once (iterating datasets' lazy Column reads it row by row, ten times slower)."""
    return data[name][:]


def word_pieces(tokenizer, sentences: list[list[str]], unk_id: int) -> list[list[list[int]]]:
    """Per sentence, per word, its WordPiece ids (``[UNK]`` for a word with none). ``tokenizer``: a
    ``tokenizers.Tokenizer`` with no post-processor."""
    out = []
    for words, encoding in zip(sentences, tokenizer.encode_batch(sentences, is_pretokenized=True,
                                                                  add_special_tokens=False)):
        pieces: list[list[int]] = [[] for _ in words]
        for token_id, word in zip(encoding.ids, encoding.word_ids):
            pieces[word].append(token_id)
        out.append([p if p else [unk_id] for p in pieces])
    return out


def context_sizes(room: int, left_available: int, right_available: int) -> tuple[int, int]:
    """Pieces of context to take before and after a sentence: half of ``room`` each side (the odd one after), one
    side taking what the other cannot use."""
    left = min(left_available, max(room // 2, room - right_available))
    return left, min(right_available, room - left)


def _featurize(batch: dict[str, list], tokenizer, cls_id: int, sep_id: int, unk_id: int, label_ids: dict[str, int],
               max_seq_length: int, document_context: bool) -> dict[str, list]:
    pieces = word_pieces(tokenizer, batch["words"], unk_id)
    flat = [[token for word in sentence for token in word] for sentence in pieces]
    docs = batch["doc_index"]
    budget = max_seq_length - 2
    out: dict[str, list] = {name: [] for name in FEATURES}
    for s, (sentence, sentence_labels) in enumerate(zip(pieces, batch["labels"])):
        starts, position = [], 0
        for word in sentence:
            starts.append(position)
            position += len(word)
        body = flat[s][:budget]
        left: list[int] = []
        right: list[int] = []
        room = budget - len(body)
        if document_context and room > 0:
            before = _neighbours(pieces, docs, s, -1, room)
            after = _neighbours(pieces, docs, s, 1, room)
            take_left, take_right = context_sizes(room, sum(map(len, before)), sum(map(len, after)))
            left = [t for word in _whole_words(before[::-1], take_left)[::-1] for t in word]
            right = [t for word in _whole_words(after, take_right) for t in word]
        offset = 1 + len(left)
        input_ids = [cls_id, *left, *body, *right, sep_id]
        word_starts = [offset + start if start < budget else CUT for start in starts]
        label = [IGNORE_INDEX] * len(input_ids)
        for start, tag in zip(word_starts, sentence_labels):
            if tag not in label_ids:
                raise ValueError(f"sentence {batch['idx'][s]}: label {tag!r} is not one of {', '.join(label_ids)}")
            if start != CUT:
                label[start] = label_ids[tag]
        out["idx"].append(batch["idx"][s])
        out["input_ids"].append(input_ids)
        out["token_type_ids"].append([0] * len(input_ids))
        out["length"].append(len(input_ids))
        out["label"].append(label)
        out["word_starts"].append(word_starts)
    return out


def _neighbours(pieces: list[list[list[int]]], docs: list[int], s: int, step: int, need: int) -> list[list[int]]:
    """The words (as pieces) of the sentences before (step -1) or after (step 1) sentence s in its document, in text
    order, at least ``need`` pieces of them where the document has that many."""
    sentences, count, t = [], 0, s + step
    while 0 <= t < len(pieces) and docs[t] == docs[s] and count < need:
        sentences.append(pieces[t])
        count += sum(map(len, pieces[t]))
        t += step
    if step < 0:
        sentences.reverse()
    return [word for sentence in sentences for word in sentence]


def _whole_words(words: list[list[int]], most: int) -> list[list[int]]:
    """The first of ``words`` that fit in ``most`` pieces together."""
    out, count = [], 0
    for word in words:
        if count + len(word) > most:
            break
        out.append(word)
        count += len(word)
    return out
