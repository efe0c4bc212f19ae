"""The second protocol's report (evidence_protocol.md), rebuilt from <out> alone: the decontamination, the sensitivity
of the first (c), the replication's endpoints over pre-training runs, the plateau tries and the remedy arm.

    build_evidence_report(out, first_record)   -> <out>/report.md (what is not finished is shown as not finished)
"""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks_common import metrics_rows
from study_evidence import (
    NO_REMEDY,
    PLATEAU_TRIES,
    PRETRAINING_SEEDS,
    REMEDY_FINETUNE_SEEDS,
    TRY_SEEDS,
    exit_step,
    highest_window,
)
from study_pairing import CELL_METRIC
from study_results import collect
from study_stats import paired, two_level, two_level_verdict, verdict

ENDPOINTS = {("sst2", "1000"): "(a') SST-2 at 1,000 labels", ("imdb", "1000"): "(c') IMDB at 1,000 labels"}
REMEDY_ENDPOINTS = {("stsb", "full"): "(b') STS-B Pearson", ("sst2", "1000"): "SST-2 at 1,000 labels"}


def _interval(mean, low, high) -> str:
    if mean is None:
        return "—"
    if low is None:
        return f"{mean:+.4f}"
    return f"{mean:+.4f} [{low:+.4f}, {high:+.4f}]"


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def decontamination(out: Path, first_record: Path) -> list[str]:
    lines = ["## 1. Decontamination", "",
             "| corpus | check | documents dropped | documents cut | paragraphs removed | words removed | "
             "training words kept |", "|---|---|---|---|---|---|---|"]
    for corpus in ("domain", "general"):
        for label, root in (("first", first_record), ("second", out)):
            stats = _json(root / "corpora" / corpus / "stats.json")
            if stats is None:
                lines.append(f"| {corpus} | {label} | not built | | | | |")
                continue
            counts = stats["counts"]
            removed = [f"{counts[key]:,}" if key in counts else "—" for key in ("paragraphs_removed", "words_removed")]
            lines.append(f"| {corpus} | {label} | {counts.get('dropped_contaminated', 0):,} | "
                         f"{counts.get('documents_cut', 0):,} | {' | '.join(removed)} | {counts['train_words']:,} |")
    for corpus in ("domain", "general"):
        stats = _json(out / "corpora" / corpus / "stats.json")
        if stats:
            matches = {k.removeprefix("matches_"): v for k, v in sorted(stats["counts"].items())
                       if k.startswith("matches_")}
            texts: dict[str, set[int]] = {}
            for item in stats["dropped"]:
                for match in item["matches"]:
                    texts.setdefault(match["eval_set"], set()).add(match["eval_index"])
            distinct = {name: len(found) for name, found in sorted(texts.items())}
            lines.append(f"\nThe {corpus} corpus: matches (document, evaluation text, rule) by rule and set "
                         f"{matches or 'none'}; distinct evaluation texts matched, by set: {distinct or 'none'}.")
    return lines


def sensitivity(out: Path) -> list[str]:
    summary = _json(out / "sensitivity" / "summary.json")
    lines = ["", "## 2. Sensitivity of the first study's (c) (not an endpoint)", ""]
    if summary is None:
        return lines + ["Not run yet."]
    every, clean = summary["gain_all"], summary["gain_clean"]
    lines += [f"`domain_120` minus `random_domain`, IMDB at 1,000 labels, seeds {every['seeds']}, re-run:",
              f"- on the 5,000 scored reviews: {_interval(every['mean'], every['low'], every['high'])};",
              f"- on the {5000 - summary['left_out']:,} that do not match the first domain corpus "
              f"({summary['left_out']} left out; {summary['left_out_against_pool']} match the domain pool): "
              f"{_interval(clean['mean'], clean['low'], clean['high'])}.",
              f"- re-runs differing from the recorded accuracy: {summary['reruns_differing_from_record'] or 'none'}."]
    return lines


def replication(out: Path, results: dict) -> list[str]:
    lines = ["", "## 3. Replication of `domain_120` over pre-training seeds", "",
             "| run | steps | held-out MLM accuracy | plateau exit (step) | rates (pre-trained / random) |",
             "|---|---|---|---|---|"]
    for run in PRETRAINING_SEEDS:
        name = f"domain_120_p{run}"
        done = _json(out / "pretrain" / name / "DONE")
        rates = " ".join(f"{task} {_rate(results, name, task)} / {_rate(results, f'random_domain_p{run}', task)}"
                         for task, _ in ENDPOINTS)
        if done is None:
            lines.append(f"| {name} | not finished | | | {rates} |")
            continue
        lines.append(f"| {name} | {done['steps']:,} | {done['heldout_mlm_acc']:.4f} | "
                     f"{exit_step(metrics_rows(out / 'pretrain' / name))} | {rates} |")
    lines += ["", "| endpoint | runs' mean gains | gain [95% t over runs] | between / within sd | bootstrap | "
              "verdict |", "|---|---|---|---|---|---|"]
    for (task, budget), label in ENDPOINTS.items():
        differences = _run_differences(results, lambda run: f"random_domain_p{run}", task, budget)
        if not differences:
            lines.append(f"| {label} | not run | | | | undecided |")
            continue
        found = two_level(differences)
        spread = "—" if found["sd"] is None else f"{found['sd']:.4f} / {found['within_sd']:.4f}"
        boot = ("—" if found["bootstrap_low"] is None else
                f"[{found['bootstrap_low']:+.4f}, {found['bootstrap_high']:+.4f}]")
        lines.append(f"| {label} | {', '.join(f'{m:+.4f}' for m in found['run_means'])} | "
                     f"{_interval(found['mean'], found['low'], found['high'])} | {spread} | {boot} | "
                     f"{two_level_verdict(found, len(PRETRAINING_SEEDS), 5)} |")
    bag = results["cells"].get("bag_of_words", {}).get(("imdb", "1000"), {})
    if bag:
        accuracies = [record["metrics"]["acc"] for record in bag.values()]
        lines.append(f"\nThe bag of words on the same IMDB subsets ({len(accuracies)} seeds): mean accuracy "
                     f"{sum(accuracies) / len(accuracies):.4f}.")
        # Beside (c'), not an endpoint: the pre-trained arm against the bag of words, with the same statistics.
        against_bag = _run_differences(results, lambda run: "bag_of_words", "imdb", "1000")
        if against_bag:
            found = two_level(against_bag)
            lines.append(f"`domain_120_p*` minus the bag of words, paired on those subsets (not an endpoint): "
                         f"{_interval(found['mean'], found['low'], found['high'])} over "
                         f"{len(found['run_means'])} runs.")
    return lines


def _run_differences(results: dict, control_of_run, task: str, budget: str) -> dict[int, dict[int, float]]:
    """d(run, seed): `domain_120_p<run>` minus its control's score, for the runs with any paired seed."""
    differences = {}
    for run in PRETRAINING_SEEDS:
        pair = _pair(results, f"domain_120_p{run}", control_of_run(run), task, budget)
        if pair["n"]:
            differences[run] = dict(zip(pair["seeds"], pair["differences"]))
    return differences


def _rate(results: dict, arm: str, task: str) -> str:
    record = results["rates"].get(arm, {}).get(task)
    return "—" if record is None else f"{record['chosen']:g}" + (" (end)" if record.get("chosen_at_the_ladders_end")
                                                                  else "")


def _pair(results: dict, treated: str, control: str, task: str, budget: str) -> dict:
    def values(arm):
        return {seed: record["metrics"][CELL_METRIC[task]]
                for seed, record in results["cells"].get(arm, {}).get((task, budget), {}).items()}
    return paired(values(treated), values(control))


def plateau(out: Path, results: dict) -> list[str]:
    lines = ["", "## 4. The plateau", "",
             "| try | change | exit, seed 1 / 2 (step) | highest window of training MLM accuracy, seed 1 / 2 | "
             "held-out MLM accuracy, seed 1 / 2 |", "|---|---|---|---|---|"]
    for name, (change, overrides) in PLATEAU_TRIES.items():
        cells = []   # per seed: (exit, highest window, held-out MLM accuracy)
        for seed in TRY_SEEDS:
            run_dir = out / "plateau" / name / f"seed{seed}"
            done = _json(run_dir / "DONE")
            if done is None:
                cells.append(("—", "—", "—"))
                continue
            rows = metrics_rows(run_dir)
            cells.append((str(exit_step(rows)), f"{highest_window(rows):.4f}", f"{done['heldout_mlm_acc']:.4f}"))
        shown = ", ".join([*(f"{k}={v}" for k, v in change.items()), *overrides]) or "none"
        lines.append(f"| {name} | {shown} | " + " | ".join(" / ".join(column) for column in zip(*cells)) + " |")
    choice = _json(out / "plateau" / "choice.json")
    if choice is not None and choice["chosen"] is None:   # the protocol's outcome, not a gap: say so, no empty table
        return lines + [f"\nChosen: none. {NO_REMEDY}"]
    lines.append("\nChosen: " + ("not yet (the tries are not finished)" if choice is None else str(choice["chosen"])))
    lines += ["", "| endpoint of `general_120_remedy` against `random_general` | gain [95% CI] | verdict |",
              "|---|---|---|"]
    for (task, budget), label in REMEDY_ENDPOINTS.items():
        pair = _pair(results, "general_120_remedy", "random_general", task, budget)
        lines.append(f"| {label} | {_interval(pair['mean'], pair['low'], pair['high'])} | "
                     f"{verdict(pair, len(REMEDY_FINETUNE_SEEDS))} |")
    return lines


def build_evidence_report(out: Path, first_record: Path) -> Path:
    results = collect(out)
    lines = ["# The second protocol's report (evidence_protocol.md)", "",
             f"Rebuilt from `{out}` by `bench_evidence.py report`.", ""]
    lines += decontamination(out, first_record) + sensitivity(out) + replication(out, results) + plateau(out, results)
    report = out / "report.md"
    out.mkdir(parents=True, exist_ok=True)
    report.write_text("\n".join(lines) + "\n")
    return report
