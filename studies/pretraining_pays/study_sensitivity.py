"""The sensitivity of the first study's endpoint (c) to the test reviews its pre-training text held
(evidence_protocol.md, section 2). Not an endpoint.

    overlaps = scored_overlaps(shared_data, first_record, data)
                                                            which of the 5,000 scored IMDB test reviews match the first
                                                            domain corpus (and the domain pool), by rule
    run_sensitivity(shared_data, out, first_record)         domain_120 and random_domain fine-tuned again on IMDB at
                                                            1,000 labels, seeds 1-5, scored on the 5,000 and on the
                                                            5,000 less the overlapping reviews

The first domain corpus is the domain pool (IMDB `unsup` and `train`, exact duplicates dropped) less the documents
the first check dropped, as the record lists them (`record/corpora/domain/stats.json`): what `domain_120` was
trained on, without rebuilding it. The re-runs use the first study's code, settings and chosen rates; their accuracy
on the 5,000 must equal the record's, and any difference is reported.
"""
from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

from study_corpora import domain_documents
from study_data import StudyData
from study_decontamination import EvaluationIndex, normalised_words
from study_record import restore_export
from study_results import finetune_root, result_path, write_json
from study_stats import paired
from study_tasks import Arm, epochs_for, run_finetune

ARMS = ("domain_120", "random_domain")
SEEDS = (1, 2, 3, 4, 5)


def scored_reviews(data: StudyData) -> list[str]:
    """The scored IMDB test reviews, in the order of the scored file (row k of it is position k here)."""
    texts, _ = data.texts(data.split("imdb", 1000, SEEDS[0]).eval, "imdb")
    return texts


def scored_overlaps(shared_data: Path, first_record: Path, data: StudyData) -> dict:
    """Positions (in the scored file) of the reviews matching a document of the first domain corpus, and of the pool."""
    dropped = {item["document"] for item in
               json.loads((first_record / "corpora" / "domain" / "stats.json").read_text())["dropped"]}
    texts = EvaluationIndex({"imdb_test": scored_reviews(data)})
    in_corpus: dict[str, set[int]] = {"exact": set(), "near": set(), "contained": set()}
    in_pool: dict[str, set[int]] = {"exact": set(), "near": set(), "contained": set()}
    documents = Counter()
    for identity, paragraphs in domain_documents(shared_data / "corpora", Counter(), quick=False):
        documents["pool"] += 1
        documents["first_corpus"] += identity not in dropped
        found = texts.matches(normalised_words("\n\n".join(paragraphs)))
        for match in found:
            in_pool[match.rule].add(match.eval_index)
            if identity not in dropped:
                in_corpus[match.rule].add(match.eval_index)

    def described(by_rule: dict[str, set[int]]) -> dict:
        every = sorted(set().union(*by_rule.values()))
        return {"reviews": len(every), "by_rule": {rule: len(found) for rule, found in by_rule.items()},
                "positions": every}

    return {"scored_reviews": len(texts.words), "pool_documents": documents["pool"],
            "first_corpus_documents": documents["first_corpus"],
            "first_corpus": described(in_corpus), "pool": described(in_pool)}


def accuracy(predictions: Path, leave_out: set[int]) -> tuple[float, int]:
    """Accuracy over the rows of a run's predictions/dev.tsv whose position is not left out, and their number."""
    with open(predictions, encoding="utf-8", newline="") as handle:
        rows = [(int(row["idx"]), row["prediction"] == row["label"]) for row in csv.DictReader(handle, delimiter="\t")]
    kept = [right for position, right in rows if position not in leave_out]
    return sum(kept) / len(kept), len(kept)


def run_sensitivity(shared_data: Path, out: Path, first_record: Path) -> dict:
    """The re-runs (each written once, so a stopped sitting resumes) and the summary, out/sensitivity/summary.json."""
    root = out / "sensitivity"
    data = StudyData(shared_data, finetune_root(root) / "data")
    overlaps_file = root / "overlaps.json"
    if not overlaps_file.is_file():
        write_json(overlaps_file, scored_overlaps(shared_data, first_record, data))
    overlaps = json.loads(overlaps_file.read_text())
    leave_out = set(overlaps["first_corpus"]["positions"])
    export = restore_export(first_record / "pretrain" / "domain_120" / "hf_export", root / "domain_120_export")
    arms = {"domain_120": Arm.of({"name": "domain_120", "init": export}),
            "random_domain": Arm.of({"name": "random_domain", "random_like": export})}
    scores: dict[str, dict[str, dict[int, float]]] = {"all": {}, "clean": {}}
    recorded_differs = []
    for name, arm in arms.items():
        lr = json.loads((first_record / "finetune" / name / "rates" / "imdb.json").read_text())["chosen"]
        for seed in SEEDS:
            path = result_path(root, name, "imdb", 1000, seed)
            if not path.is_file():
                files = data.split("imdb", 1000, seed)
                run_dir = finetune_root(root) / name / "runs" / f"imdb-1000-seed{seed}"
                made = run_finetune(files, arm.weights(seed, root), lr, epochs_for("imdb", 1000, False), seed,
                                    run_dir, finetune_root(root) / "cache")
                every, _ = accuracy(run_dir / "predictions" / "dev.tsv", set())
                clean, kept = accuracy(run_dir / "predictions" / "dev.tsv", leave_out)
                recorded = json.loads(result_path(first_record, name, "imdb", 1000, seed).read_text())
                write_json(path, {"arm": name, "seed": seed, "lr": lr, "acc_all": every, "acc_clean": clean,
                                  "clean_rows": kept, "run_acc": made["metrics"]["acc"],
                                  "recorded_acc": recorded["metrics"]["acc"], "seconds": made["seconds"]})
            result = json.loads(path.read_text())
            scores["all"].setdefault(name, {})[seed] = result["acc_all"]
            scores["clean"].setdefault(name, {})[seed] = result["acc_clean"]
            if round(result["acc_all"], 4) != round(result["recorded_acc"], 4):
                recorded_differs.append({"arm": name, "seed": seed, "rerun": result["acc_all"],
                                         "recorded": result["recorded_acc"]})
    summary = {"left_out": len(leave_out), "left_out_against_pool": overlaps["pool"]["reviews"],
               "gain_all": paired(scores["all"]["domain_120"], scores["all"]["random_domain"]),
               "gain_clean": paired(scores["clean"]["domain_120"], scores["clean"]["random_domain"]),
               "reruns_differing_from_record": recorded_differs}
    write_json(root / "summary.json", summary)
    return summary
