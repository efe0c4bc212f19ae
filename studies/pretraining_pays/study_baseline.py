"""The bag-of-words baseline of the study (study_protocol.md, section 4), for SST-2 at each label budget and
IMDB at 1,000: scikit-learn's logistic regression on uni- and bigram counts, trained on the same labelled subsets as
the arms, its C chosen from {0.1, 1, 10} as the arms' rates are (seed 0's 1,000, scored on the rate-selection slice).

    run_baseline(shared_data, out, seeds=(1, 2, 3, 4, 5), quick=False)
        -> <out>/finetune/bag_of_words/<task>/<budget>/seed<N>.json and bag_of_words/rates/<task>.json (the choice)

IMDB's input is cut as the arms' is: they read a review's first 128 tokens, so the baseline reads its first 128 words
(CountVectorizer's own tokens, lowercased). The solver is liblinear: on these sparse counts it is several times faster
than lbfgs, and reaches the same L2-regularised optimum but for the intercept, which it regularises too.
"""
from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

from study_data import BUDGETS, SEEDS, StudyData
from study_results import BAG_OF_WORDS, finetune_root, rate_choice_path, read_done, result_path, write_json

C_GRID = (0.1, 1.0, 10.0)
TASKS = ("sst2", "imdb")
MAX_WORDS = 128
_WORD = re.compile(r"(?u)\b\w\w+\b")   # CountVectorizer's default token pattern


def first_words(text: str, count: int = MAX_WORDS) -> str:
    return " ".join(_WORD.findall(text.lower())[:count])


def bag_of_words_accuracy(train: tuple[Sequence[str], Sequence[int]], scored: tuple[Sequence[str], Sequence[int]],
                          c: float, seed: int) -> float:
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    model = make_pipeline(CountVectorizer(ngram_range=(1, 2)),
                          LogisticRegression(C=c, solver="liblinear", max_iter=5000, random_state=seed))
    model.fit(list(train[0]), list(train[1]))
    return float(model.score(list(scored[0]), list(scored[1])))


def run_baseline(shared_data: Path, out: Path, seeds: Sequence[int] | None = None, quick: bool = False) -> None:
    seeds = tuple(seeds) if seeds is not None else ((1,) if quick else SEEDS)
    data = StudyData(shared_data, finetune_root(out) / "data", quick)
    cache = finetune_root(out) / "cache"
    for task in TASKS:
        def read(path, task=task):
            return _inputs(data, path, task, cache)

        c = _choose_c(data, read, task, out, quick)
        for seed in seeds:
            for budget in BUDGETS[task]:
                path = result_path(out, BAG_OF_WORDS, task, budget, seed)
                if read_done(path, quick):
                    continue
                started = time.perf_counter()
                files = data.split(task, budget, seed)
                accuracy = bag_of_words_accuracy(read(files.train), read(files.eval), c, seed)
                write_json(path, {"arm": BAG_OF_WORDS, "task": task, "budget": str(budget), "seed": seed,
                                  "quick": quick, "metrics": {"acc": accuracy}, "C": c,
                                  "train_rows": files.train_rows, "eval_rows": files.eval_rows,
                                  "eval_set": files.eval_name, "seconds": round(time.perf_counter() - started, 2)})
                print(f"{BAG_OF_WORDS} {task} {budget} seed {seed}: acc {accuracy:.4f} (C={c:g})", flush=True)


def _inputs(data: StudyData, path: Path, task: str, cache: Path) -> tuple[list[str], list[int]]:
    texts, labels = data.texts(path, task, cache)
    return ([first_words(t) for t in texts] if task == "imdb" else texts), labels


def _choose_c(data: StudyData, read, task: str, out: Path, quick: bool) -> float:
    path = rate_choice_path(out, BAG_OF_WORDS, task)
    done = read_done(path, quick)
    if done:
        return float(done["chosen"])
    files = data.selection(task)
    train, scored = read(files.train), read(files.eval)
    tries = {f"{c:g}": bag_of_words_accuracy(train, scored, c, 0) for c in C_GRID}
    chosen = max(C_GRID, key=lambda c: tries[f"{c:g}"])   # the first of equal scores: the strongest regularisation
    write_json(path, {"arm": BAG_OF_WORDS, "task": task, "quick": quick, "parameter": "C", "grid": list(C_GRID),
                      "scores": tries, "chosen": chosen, "train_rows": files.train_rows,
                      "eval_rows": files.eval_rows, "eval_set": files.eval_name})
    return chosen
