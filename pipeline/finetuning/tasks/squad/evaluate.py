"""SQuAD v1.1's exact match and F1, computed as the official evaluate-v1.1.py does: answers normalised (lower case,
punctuation removed, the articles a/an/the removed, whitespace collapsed), the maximum over a question's gold
answers, a question without a prediction scores 0, and both in percent of all questions."""
from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence

import datasets

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation (ASCII, as string.punctuation), no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match_score(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def f1_score(prediction: str, ground_truth: str) -> float:
    prediction_tokens = normalize_answer(prediction).split()
    truth_tokens = normalize_answer(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(truth_tokens)
    same = sum(common.values())
    if same == 0:
        return 0
    precision = 1.0 * same / len(prediction_tokens)
    recall = 1.0 * same / len(truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def gold_answers(examples: datasets.Dataset | Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """id -> gold answer texts, from a dataset of SQuAD examples (id, answers) or such a mapping itself."""
    if isinstance(examples, Mapping):
        return {str(qid): list(texts) for qid, texts in examples.items()}
    table = examples.select_columns(["id", "answers"]).with_format("arrow")[:]
    texts = table.column("answers").combine_chunks().field("text").to_pylist()
    return dict(zip(table.column("id").to_pylist(), texts))


def squad_v1_metrics(examples: datasets.Dataset | Mapping[str, Sequence[str]],
                     predictions: Mapping[str, str]) -> dict[str, float]:
    """{"exact_match": %, "f1": %} over every question of `examples` (a dataset with id/answers, or a mapping
    id -> gold texts). Predictions for ids not among the questions are ignored, as the official script does."""
    gold = gold_answers(examples)
    if not gold:
        raise ValueError("no questions to evaluate")
    exact_match = f1 = 0
    for qid, truths in gold.items():
        if not truths:
            raise ValueError(f"question {qid} has no gold answer: SQuAD v1.1 evaluation needs at least one")
        if qid not in predictions:
            continue    # unanswered: scores 0
        prediction = predictions[qid]
        exact_match += max(exact_match_score(prediction, truth) for truth in truths)
        f1 += max(f1_score(prediction, truth) for truth in truths)
    return {"exact_match": 100.0 * exact_match / len(gold), "f1": 100.0 * f1 / len(gold)}
