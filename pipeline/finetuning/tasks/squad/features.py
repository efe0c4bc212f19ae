"""SQuAD questions -> model inputs: ``[CLS] question [SEP] context window [SEP]``, as google-research/bert's
run_squad.py makes them, with the answer located through the tokenizer's character offsets instead of the
reference's whitespace split and re-tokenisation.

- The question is cut to ``max_query_length`` tokens (counted in the report).
- The context's tokens are covered by windows of at most ``max_seq_length - len(question) - 3`` tokens; each window
  starts ``min(window length, doc_stride)`` tokens after the previous one, and the last ends at the context's end.
- ``max_context`` marks, per token, whether this window is the one where the token has the most context (the
  reference's ``_check_is_max_context``: score ``min(left, right) + 0.01 * window length``, the first window wins a
  tie). Post-processing only starts answers at such tokens, so each span of the context is scored once.
- ``label``: the answer's first and last token in the feature (the first answer of the question, as the reference
  trains on); ``[0, 0]`` (the [CLS] token) when it is not wholly inside this window, as the reference does for
  v1.1. The answer's tokens are those whose character span overlaps ``[answer_start, answer_start + len(text))``.
- ``offsets``: per token ``[char_start, char_end]`` in the context (``[-1, -1]`` for the question and the special
  tokens): an answer's text is ``context[offsets[start][0]:offsets[end][1]]``.

An answer whose ``answer_start`` does not point at its text (``context[s:s + len(text)] != text``) is counted; so is
one that covers no token (only whitespace or characters the normaliser drops). Training skips both, and questions
without an answer; evaluation keeps every question (the metric uses the gold texts, not the positions).

The features are made by one batched ``datasets.map`` cached under a fingerprint of the examples, the tokenizer, the
settings and this module's code, so a second run with the same inputs loads them at once.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import datasets
import numpy as np
import pyarrow as pa

from pipeline.finetuning.fingerprint import cache_key, code_digest

if TYPE_CHECKING:
    from pipeline.finetuning.tokenizer import LoadedTokenizer

FEATURES_VERSION = 1   # bump when the features change for the same inputs (invalidates the cache)
_CODE_DIGEST = code_digest(__file__)

# answer_status of a question (a helper column, dropped before the features are returned)
ANSWER_OK, NO_ANSWER, MISALIGNED, NO_TOKENS = 0, 1, 2, 3

FEATURE_COLUMNS = datasets.Features({
    "input_ids": datasets.List(datasets.Value("int32")),
    "token_type_ids": datasets.List(datasets.Value("int8")),
    "length": datasets.Value("int32"),
    "label": datasets.List(datasets.Value("int32"), length=2),
    "example_index": datasets.Value("int64"),
    "offsets": datasets.List(datasets.List(datasets.Value("int32"), length=2)),
    "max_context": datasets.List(datasets.Value("bool")),
    # helpers for the report, removed afterwards
    "window": datasets.Value("int32"),
    "query_tokens": datasets.Value("int32"),
    "answer_status": datasets.Value("int8"),
})
_HELPERS = ["window", "query_tokens", "answer_status"]


def window_starts(num_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window over `num_tokens` context tokens, as the reference's doc_spans."""
    spans, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens_for_doc)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans


def max_context_windows(spans: list[tuple[int, int]], num_tokens: int) -> np.ndarray:
    """For each context token, the index of the window where it has the most context (the reference's
    _check_is_max_context for every token at once; ties go to the first window)."""
    starts = np.array([s for s, _ in spans], dtype=np.int64)[:, None]
    lengths = np.array([n for _, n in spans], dtype=np.int64)[:, None]
    position = np.arange(num_tokens, dtype=np.int64)[None, :]
    inside = (position >= starts) & (position < starts + lengths)
    score = np.minimum(position - starts, starts + lengths - 1 - position) + 0.01 * lengths
    score = np.where(inside, score, -np.inf)
    return np.argmax(score, axis=0)


def answer_token_span(token_offsets: np.ndarray, char_start: int, char_end: int) -> tuple[int, int] | None:
    """First and last token whose character span overlaps [char_start, char_end), or None if no token does.
    `token_offsets` (N, 2): the context tokens' character spans, in order."""
    first = int(np.searchsorted(token_offsets[:, 1], char_start, side="right"))   # first token ending after start
    last = int(np.searchsorted(token_offsets[:, 0], char_end, side="left")) - 1    # last token starting before end
    if first > last or first >= len(token_offsets) or last < 0:
        return None
    return first, last


def _answer(context: str, answers: dict[str, list]) -> tuple[int, int, int] | tuple[int, None, None]:
    """(status, char_start, char_end) of the question's first answer."""
    if not answers["text"]:
        return NO_ANSWER, None, None
    text, start = answers["text"][0], answers["answer_start"][0]
    if start is None or start < 0 or context[start:start + len(text)] != text:
        return MISALIGNED, None, None
    return ANSWER_OK, start, start + len(text)


def _list_array(values: np.ndarray, lengths: list[int], value_type: pa.DataType) -> pa.Array:
    """Rows of a list column from its flat values and each row's length (values (N, 2): a list of pairs)."""
    row_offsets = pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32))
    if values.ndim == 2:
        flat = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), type=value_type), values.shape[1])
    else:
        flat = pa.array(values, type=value_type)
    return pa.ListArray.from_arrays(row_offsets, flat)


def _feature_batch(rows: dict[str, list], indices: list[int], tokenizer: LoadedTokenizer, max_seq_length: int,
                   doc_stride: int, max_query_length: int) -> pa.Table:
    """A batch of questions -> its features, as an Arrow table built from flat numpy arrays (no per-token Python
    objects)."""
    questions = tokenizer.encode(rows["question"])
    unique = list(dict.fromkeys(rows["context"]))
    encoded = tokenizer.tokenizer.encode_batch(unique, add_special_tokens=False)
    contexts = {text: (np.asarray(e.ids, dtype=np.int32), np.asarray(e.offsets, dtype=np.int32).reshape(-1, 2))
                for text, e in zip(unique, encoded)}
    sep = np.array([tokenizer.sep_id], dtype=np.int32)
    no_offset = np.full((1, 2), -1, dtype=np.int32)
    ids_parts, type_parts, offset_parts, context_parts = [], [], [], []
    lengths, labels, example_index, window, query_tokens, answer_status = [], [], [], [], [], []
    for index, question, context, answers in zip(indices, questions, rows["context"], rows["answers"]):
        query = question[:max_query_length]
        ids, offsets = contexts[context]
        status, char_start, char_end = _answer(context, answers)
        span = None
        if status == ANSWER_OK:
            span = answer_token_span(offsets, char_start, char_end)
            if span is None:
                status = NO_TOKENS
        if len(ids) == 0:
            continue
        spans = window_starts(len(ids), max_seq_length - len(query) - 3, doc_stride)
        best = max_context_windows(spans, len(ids))
        head = np.array([tokenizer.cls_id, *query, tokenizer.sep_id], dtype=np.int32)
        shift = len(head)
        head_offsets = np.full((shift, 2), -1, dtype=np.int32)
        head_context = np.zeros(shift, dtype=bool)
        for w, (start, length) in enumerate(spans):
            end = start + length
            ids_parts += [head, ids[start:end], sep]
            type_parts += [np.zeros(shift, dtype=np.int8), np.ones(length + 1, dtype=np.int8)]
            offset_parts += [head_offsets, offsets[start:end], no_offset]
            context_parts += [head_context, best[start:end] == w, head_context[:1]]
            lengths.append(shift + length + 1)
            if span is not None and start <= span[0] and span[1] < end:
                labels.append((span[0] - start + shift, span[1] - start + shift))
            else:
                labels.append((0, 0))
            example_index.append(index)
            window.append(w)
            query_tokens.append(len(question))
            answer_status.append(status)
    if not lengths:   # no feature in this batch (empty contexts): an empty table of the right schema
        return FEATURE_COLUMNS.arrow_schema.empty_table()
    label_values = np.asarray(labels, dtype=np.int32)
    columns = {
        "input_ids": _list_array(np.concatenate(ids_parts), lengths, pa.int32()),
        "token_type_ids": _list_array(np.concatenate(type_parts), lengths, pa.int8()),
        "length": pa.array(lengths, type=pa.int32()),
        "label": pa.FixedSizeListArray.from_arrays(pa.array(label_values.reshape(-1), type=pa.int32()), 2),
        "example_index": pa.array(example_index, type=pa.int64()),
        "offsets": _list_array(np.concatenate(offset_parts), lengths, pa.int32()),
        "max_context": _list_array(np.concatenate(context_parts), lengths, pa.bool_()),
        "window": pa.array(window, type=pa.int32()),
        "query_tokens": pa.array(query_tokens, type=pa.int32()),
        "answer_status": pa.array(answer_status, type=pa.int8()),
    }
    return pa.Table.from_pydict(columns, schema=FEATURE_COLUMNS.arrow_schema)


def _settings(max_seq_length: int, doc_stride: int, max_query_length: int) -> tuple[int, int, int]:
    max_seq_length, doc_stride, max_query_length = int(max_seq_length), int(doc_stride), int(max_query_length)
    if max_query_length < 1 or doc_stride < 1:
        raise ValueError(f"doc_stride ({doc_stride}) and max_query_length ({max_query_length}) must be positive")
    if max_seq_length - max_query_length - 3 < 1:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for the context after a question of "
                         f"max_query_length={max_query_length} tokens and [CLS]/[SEP]/[SEP]: set max_query_length "
                         f"to at most {max_seq_length - 4}")
    return max_seq_length, doc_stride, max_query_length


def squad_features(examples: datasets.Dataset, tokenizer: LoadedTokenizer, max_seq_length: int = 384,
                   doc_stride: int = 128, max_query_length: int = 64, training: bool = False
                   ) -> tuple[datasets.Dataset, dict[str, Any]]:
    """(features, report) for SQuAD examples (the columns of pipeline.finetuning.tasks.squad.reader).

    Feature columns: input_ids, token_type_ids, length, label ([start, end]), example_index (row of `examples`),
    offsets (per token [char_start, char_end] in the context, [-1, -1] outside it), max_context (per token bool).
    Report: examples, features, questions_truncated, answers_misaligned, answers_without_tokens and
    examples_without_answer (these four over the questions whose context has tokens), examples_without_features
    (an empty context), examples_skipped (training: all of the last four; evaluation: 0).
    """
    max_seq_length, doc_stride, max_query_length = _settings(max_seq_length, doc_stride, max_query_length)
    fingerprint = cache_key(examples._fingerprint, tokenizer.fingerprint, max_seq_length, doc_stride, max_query_length,
                            FEATURES_VERSION, _CODE_DIGEST)
    features = examples.map(
        _feature_batch, with_indices=True, batched=True, batch_size=1000, remove_columns=examples.column_names,
        features=FEATURE_COLUMNS, new_fingerprint=fingerprint, desc="SQuAD features",
        fn_kwargs={"tokenizer": tokenizer, "max_seq_length": max_seq_length, "doc_stride": doc_stride,
                   "max_query_length": max_query_length})
    helpers = features.select_columns(_HELPERS).with_format("numpy")[:]
    first = helpers["window"] == 0            # one row per example that has features
    status = helpers["answer_status"][first]
    report = {
        "examples": len(examples),
        "questions_truncated": int(np.sum(helpers["query_tokens"][first] > max_query_length)),
        "answers_misaligned": int(np.sum(status == MISALIGNED)),
        "answers_without_tokens": int(np.sum(status == NO_TOKENS)),
        "examples_without_answer": int(np.sum(status == NO_ANSWER)),
        "examples_without_features": len(examples) - int(np.sum(first)),
    }
    if training:
        keep = helpers["answer_status"] == ANSWER_OK
        report["examples_skipped"] = len(examples) - int(np.sum(first & keep))
        if not keep.all():
            features = features.select(np.flatnonzero(keep))
    else:
        report["examples_skipped"] = 0
    features = features.remove_columns(_HELPERS)
    report["features"] = len(features)
    return features, report
