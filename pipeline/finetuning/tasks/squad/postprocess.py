"""Start/end logits per feature -> an answer text per question and its n-best list, as google-research/bert's
run_squad.py write_predictions does, vectorised with numpy.

Per feature, the `n_best` highest start logits among tokens that may start an answer (context tokens with
max_context) and the `n_best` highest end logits among context tokens; every pair with end >= start and at most
`max_answer_length` tokens is a candidate scored start_logit + end_logit. A question's candidates from all its
features, best first, give the n-best list: the first `n_best` distinct texts
``context[offsets[start][0]:offsets[end][1]]``, with probabilities from a softmax over their scores. The prediction
is the first of them. Ties are broken as the reference's stable sorts break them: equal logits by position, equal
scores by feature, start rank, end rank.

One deliberate difference: the reference takes the top n_best over all positions and then drops the invalid ones,
so question or padding tokens with high logits can crowd out valid candidates; here invalid positions are masked
first. Where the reference finds a candidate, ours is the same or better scored. A question with no candidate at
all (no context tokens) is predicted "" (the reference writes the placeholder text "empty").
"""
from __future__ import annotations

import math
from typing import Any

import datasets
import numpy as np
import pyarrow as pa


def _token_table(features: datasets.Dataset) -> dict[str, np.ndarray]:
    """The columns post-processing needs, flat over all tokens, in the features' logical order."""
    table: pa.Table = features.select_columns(["example_index", "offsets", "max_context"]).with_format("arrow")[:]
    offsets = table.column("offsets").combine_chunks()
    counts = offsets.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
    flat = offsets.flatten().flatten().to_numpy(zero_copy_only=False).astype(np.int64).reshape(-1, 2)
    max_context = table.column("max_context").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return {"example_index": table.column("example_index").to_numpy().astype(np.int64), "counts": counts,
            "offsets": flat, "max_context": max_context.astype(bool)}


def _softmax(scores: list[float]) -> list[float]:
    """The reference's _compute_softmax."""
    top = max(scores)
    exps = [math.exp(score - top) for score in scores]
    total = sum(exps)
    return [value / total for value in exps]


def postprocess(examples: datasets.Dataset, features: datasets.Dataset, start_logits: list[np.ndarray],
                end_logits: list[np.ndarray], n_best: int = 20, max_answer_length: int = 30
                ) -> tuple[dict[str, str], dict[str, list[dict[str, Any]]]]:
    """(predictions: id -> text, n-best: id -> [{"text", "probability", "start_logit", "end_logit"}, ...]).

    `start_logits[i]` / `end_logits[i]`: the logits of feature i (its tokens; longer arrays, padded batches, are cut
    to the feature's length). Features must be grouped by example in example order, as squad_features makes them.
    """
    if len(start_logits) != len(features) or len(end_logits) != len(features):
        raise ValueError(f"{len(start_logits)} start and {len(end_logits)} end logit arrays for "
                         f"{len(features)} features")
    if n_best < 1 or max_answer_length < 1:
        raise ValueError(f"n_best ({n_best}) and max_answer_length ({max_answer_length}) must be positive")
    tokens = _token_table(features)
    counts, num_features = tokens["counts"], len(features)
    text_columns = examples.select_columns(["id", "context"]).with_format("arrow")[:]
    ids = text_columns.column("id").to_pylist()
    contexts = text_columns.column("context").to_pylist()
    if num_features and np.any(np.diff(tokens["example_index"]) < 0):
        raise ValueError("features are not in example order")

    # -- per feature, padded to the longest: masked logits, top-k starts and ends ------------------------------------
    width = int(counts.max()) if num_features else 0
    row_start = np.concatenate([[0], np.cumsum(counts)])
    feature_of = np.repeat(np.arange(num_features), counts)
    position = np.arange(int(row_start[-1])) - np.repeat(row_start[:-1], counts)
    start_all = np.empty(int(row_start[-1]), dtype=np.float32)
    end_all = np.empty(int(row_start[-1]), dtype=np.float32)
    for i in range(num_features):
        n = counts[i]
        s, e = np.asarray(start_logits[i]).reshape(-1), np.asarray(end_logits[i]).reshape(-1)
        if len(s) < n or len(e) < n:
            raise ValueError(f"feature {i} has {n} tokens but {len(s)} start and {len(e)} end logits")
        start_all[row_start[i]:row_start[i + 1]] = s[:n]
        end_all[row_start[i]:row_start[i + 1]] = e[:n]
    in_context = tokens["offsets"][:, 0] >= 0
    starts = np.full((num_features, width), -np.inf, dtype=np.float32)
    ends = np.full((num_features, width), -np.inf, dtype=np.float32)
    starts[feature_of, position] = np.where(in_context & tokens["max_context"], start_all, -np.inf)
    ends[feature_of, position] = np.where(in_context, end_all, -np.inf)

    k = min(n_best, width)
    predictions: dict[str, str] = {}
    nbest: dict[str, list[dict[str, Any]]] = {}
    if k > 0:
        def top(matrix):   # (F, k) positions, by logit descending, lower position first on ties
            chosen = np.argpartition(-matrix, k - 1, axis=1)[:, :k]
            values = np.take_along_axis(matrix, chosen, axis=1)
            # where the k-th value is tied with positions left out, argpartition chose among them arbitrarily: those
            # rows are sorted stably, so the lowest positions are kept as the reference's stable sort keeps them
            kth = values.min(axis=1, keepdims=True)
            tied = np.flatnonzero(np.isfinite(kth[:, 0])
                                  & ((matrix == kth).sum(axis=1) > (values == kth).sum(axis=1)))
            if len(tied):
                chosen[tied] = np.argsort(-matrix[tied], axis=1, kind="stable")[:, :k]
                values = np.take_along_axis(matrix, chosen, axis=1)
            order = np.lexsort((chosen, -values), axis=1)
            chosen = np.take_along_axis(chosen, order, axis=1)
            return chosen, np.take_along_axis(matrix, chosen, axis=1)

        s_pos, s_val = top(starts)
        e_pos, e_val = top(ends)
        length = e_pos[:, None, :] - s_pos[:, :, None] + 1
        valid = (np.isfinite(s_val)[:, :, None] & np.isfinite(e_val)[:, None, :]
                 & (length >= 1) & (length <= max_answer_length))
        f, i, j = np.nonzero(valid)   # C order: feature, start rank, end rank: the reference's insertion order
        cand_start, cand_end = s_pos[f, i], e_pos[f, j]
        cand_s_logit, cand_e_logit = s_val[f, i], e_val[f, j]
        score = cand_s_logit.astype(np.float64) + cand_e_logit.astype(np.float64)
        example = tokens["example_index"][f]
        order = np.lexsort((-score, example))     # by example, then score descending; stable otherwise
        example, f = example[order], f[order]
        first_token = row_start[f] + cand_start[order]
        last_token = row_start[f] + cand_end[order]
        char_start = tokens["offsets"][first_token, 0].tolist()
        char_end = tokens["offsets"][last_token, 1].tolist()
        s_logit, e_logit = cand_s_logit[order].tolist(), cand_e_logit[order].tolist()
        bounds = np.searchsorted(example, np.arange(len(ids) + 1)).tolist()
    else:
        bounds = [0] * (len(ids) + 1)

    for row, qid in enumerate(ids):
        entries, seen = [], set()
        lo, hi = bounds[row], bounds[row + 1]
        if lo < hi:
            context = contexts[row]
            for c in range(lo, hi):
                text = context[char_start[c]:char_end[c]]
                if text in seen:
                    continue
                seen.add(text)
                entries.append({"text": text, "start_logit": s_logit[c], "end_logit": e_logit[c]})
                if len(entries) == n_best:
                    break
        if not entries:
            entries.append({"text": "", "start_logit": 0.0, "end_logit": 0.0})
        probabilities = _softmax([e["start_logit"] + e["end_logit"] for e in entries])
        nbest[qid] = [{"text": e["text"], "probability": p, "start_logit": e["start_logit"],
                       "end_logit": e["end_logit"]} for e, p in zip(entries, probabilities)]
        predictions[qid] = entries[0]["text"]
    return predictions, nbest
