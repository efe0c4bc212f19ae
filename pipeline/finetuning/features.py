"""Task rows -> model inputs: WordPiece ids with [CLS]/[SEP], segment ids, the label; nothing padded.

As google-research/bert's run_classifier.py: a single sentence is cut to max_seq_length - 2 tokens; a pair is cut
to max_seq_length - 3 by taking tokens off the end of the longer side, one at a time (the second on ties), which
`truncated_lengths` computes in closed form. A pair whose second text has no tokens (empty, or only whitespace) is a
single sentence, [CLS] a [SEP], as the reference encodes it. Multiple choice (SWAG) makes one pair per ending, as the
paper describes: the context as segment A, the ending's start followed by the ending as segment B.

The featurized dataset is cached by `datasets` under a fingerprint of the rows, the tokenizer, the length and
this module's FEATURES_VERSION, so a second run with the same inputs starts at once.
"""
from __future__ import annotations

from typing import Any

import datasets

from pipeline.finetuning.fingerprint import cache_key
from pipeline.finetuning.tokenizer import LoadedTokenizer

FEATURES_VERSION = 2   # bump when the features change for the same inputs (invalidates the cache)


def truncated_lengths(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """The lengths the reference's _truncate_seq_pair leaves: pop from the longer side (b on ties) until the pair
    fits `budget`. Whoever is longer shrinks to the other's length first; after that they alternate, which leaves
    a with the odd token."""
    if len_a + len_b <= budget:
        return len_a, len_b
    if len_b <= budget // 2:
        return budget - len_b, len_b
    if len_a <= (budget + 1) // 2:
        return len_a, budget - len_a
    return (budget + 1) // 2, budget // 2


def encode_pair(ids_a: list[int], ids_b: list[int] | None, max_seq_length: int, cls_id: int,
                sep_id: int) -> tuple[list[int], list[int], int]:
    """([CLS] a [SEP] (b [SEP]), segment ids, tokens cut). No b, or a b without tokens: a single sentence."""
    if not ids_b:
        keep_a = min(len(ids_a), max_seq_length - 2)
        return [cls_id, *ids_a[:keep_a], sep_id], [0] * (keep_a + 2), len(ids_a) - keep_a
    keep_a, keep_b = truncated_lengths(len(ids_a), len(ids_b), max_seq_length - 3)
    input_ids = [cls_id, *ids_a[:keep_a], sep_id, *ids_b[:keep_b], sep_id]
    token_type_ids = [0] * (keep_a + 2) + [1] * (keep_b + 1)
    return input_ids, token_type_ids, len(ids_a) + len(ids_b) - keep_a - keep_b


def sentence_features(rows: dict[str, list], tokenizer: LoadedTokenizer, max_seq_length: int) -> dict[str, list]:
    """A batch of sentence / sentence-pair rows (text_a, text_b, label) -> features (datasets.map, batched)."""
    ids_a = tokenizer.encode(rows["text_a"])
    has_b = [text is not None for text in rows["text_b"]]
    encoded_b = iter(tokenizer.encode([text for text in rows["text_b"] if text is not None]))
    ids_b = [next(encoded_b) if present else None for present in has_b]
    out: dict[str, list] = {"input_ids": [], "token_type_ids": [], "tokens_cut": []}
    for a, b in zip(ids_a, ids_b):
        input_ids, token_type_ids, cut = encode_pair(a, b, max_seq_length, tokenizer.cls_id, tokenizer.sep_id)
        out["input_ids"].append(input_ids)
        out["token_type_ids"].append(token_type_ids)
        out["tokens_cut"].append(cut)
    out["length"] = [len(ids) for ids in out["input_ids"]]
    return out


def multiple_choice_features(rows: dict[str, list], tokenizer: LoadedTokenizer,
                             max_seq_length: int) -> dict[str, list]:
    """A batch of SWAG rows (context, start, endings, label) -> one pair per ending, (K, T_k) per row."""
    contexts = tokenizer.encode(rows["context"])
    flat_endings = [f"{start} {ending}".strip() for start, endings in zip(rows["start"], rows["endings"])
                    for ending in endings]
    encoded_endings = iter(tokenizer.encode(flat_endings))
    out: dict[str, list] = {"input_ids": [], "token_type_ids": [], "tokens_cut": [], "length": []}
    for context, endings in zip(contexts, rows["endings"]):
        choice_ids, choice_types, cut = [], [], 0
        for _ in endings:
            input_ids, token_type_ids, choice_cut = encode_pair(context, next(encoded_endings), max_seq_length,
                                                                tokenizer.cls_id, tokenizer.sep_id)
            choice_ids.append(input_ids)
            choice_types.append(token_type_ids)
            cut += choice_cut
        out["input_ids"].append(choice_ids)
        out["token_type_ids"].append(choice_types)
        out["tokens_cut"].append(cut)
        out["length"].append(max(len(ids) for ids in choice_ids))
    return out


FEATURIZERS = {"classification": sentence_features, "regression": sentence_features,
               "multiple_choice": multiple_choice_features}


def featurize(rows: datasets.Dataset, kind: str, tokenizer: LoadedTokenizer, max_seq_length: int,
              description: str = "features") -> datasets.Dataset:
    """Features for every row, keeping idx and label; cached by datasets under a fingerprint of everything that
    shapes them."""
    if max_seq_length < 4:
        raise ValueError(f"max_seq_length must be at least 4 ([CLS] a [SEP] b [SEP]), got {max_seq_length}")
    fingerprint = cache_key(rows._fingerprint, kind, tokenizer.fingerprint, max_seq_length, FEATURES_VERSION)
    keep = {"idx", "label"}
    return rows.map(FEATURIZERS[kind], batched=True, batch_size=1000,
                    fn_kwargs={"tokenizer": tokenizer, "max_seq_length": max_seq_length},
                    remove_columns=[c for c in rows.column_names if c not in keep],
                    new_fingerprint=fingerprint, desc=description)


def truncation_report(features: datasets.Dataset) -> dict[str, Any]:
    """How many examples were cut to fit, and how many tokens that took off."""
    cut = features["tokens_cut"][:]
    return {"examples": len(cut), "examples_truncated": sum(1 for c in cut if c > 0),
            "tokens_cut": int(sum(cut))}
