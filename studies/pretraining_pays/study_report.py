"""The study's report, rebuilt from its result files alone (study_protocol.md, section 4).

    build_report(out, pretrain_runs={"domain_120": <run dir>, ...}, seeds=None, heldout_mlm=None)
        -> <out>/report/report.md

Reads <out>/finetune/ (study_results.py) and each pre-training run's csv/metrics.csv; writes into <out>/report/:
- report.md: the table (every arm x task and budget: mean ± sd over seeds; the bag-of-words row), the rates chosen,
  the paired differences of each pre-trained arm against the random arm of its vocabulary with their 95% t-intervals,
  the three primary endpoints met or not, the secondary comparisons, the recipe search (each try's held-out MLM
  accuracy and selection probe per corpus, from <out>/search/<corpus>/<try>/DONE, and each corpus's choice.json),
  and what is missing;
- results.json: the same numbers, every seed's value included;
- score_vs_labels.png (SST-2 at 500 / 1,000 / 5,000 labels and IMDB at 1,000, per arm, with the intervals),
  gains_vs_labels.png (the same as paired gains over the random arm, with theirs) and mlm_curves.png (held-out MLM
  accuracy against the step, both corpora).
Nothing is filled in: an arm, a seed or a run without its file is shown as missing, and an endpoint without all its
seeds is undecided. seeds: the seeds the study has (default: (1,) when the results are a quick run's, else 1-5).
heldout_mlm: {run: MLM accuracy on the domain corpus's MLM-only held-out set} for the objective comparison (default:
<out>/pretrain/heldout_mlm_only.json when it exists).
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from study_data import SEEDS
from study_figures import gains_against_labels, mlm_curves, score_against_labels
from study_recipe import TRIES, TRY_MINUTES, finished_tries
from study_results import ARMS, BAG_OF_WORDS, CELLS, RANDOM_ARM, collect
from study_stats import paired, summary, t_interval, t_quantile, verdict

PRIMARY = (("a", "domain_120", "sst2", "1000", "acc"), ("b", "general_120", "stsb", "full", "pearson"),
           ("c", "domain_120", "imdb", "1000", "acc"))
SECONDARY = tuple((f"{name} at 60 min", arm.replace("_120", "_60"), *rest) for name, arm, *rest in PRIMARY)
FIGURE_CELLS = (("sst2", "500"), ("sst2", "1000"), ("sst2", "5000"), ("imdb", "1000"))
OBJECTIVE_ARMS = ("domain_60", "domain_60_other")
TURC_TINY_COLA = 0.0
HELDOUT_FILE = Path("pretrain") / "heldout_mlm_only.json"
MISSING = "missing"


def _key(task: str, budget: str) -> str:
    return f"{task}/{budget}"


def seed_values(found: dict, arm: str, task: str, budget: str, metric: str, seeds: Sequence[int]) -> dict[int, float]:
    by_seed = found["cells"].get(arm, {}).get((task, budget), {})
    return {s: float(by_seed[s]["metrics"][metric]) for s in seeds if s in by_seed and metric in by_seed[s]["metrics"]}


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    if not math.isfinite(value):
        return "nan"
    return f"{value:+.4f}" if signed else f"{value:.4f}"


def _cell_text(cell: dict, wanted: int) -> str:
    if cell["n"] == 0:
        return MISSING
    text = _fmt(cell["mean"]) + (f" ± {_fmt(cell['sd'])}" if cell["sd"] is not None else "")
    return text + (f" ({cell['n']} of {wanted} seeds)" if cell["n"] < wanted else "")


def _pair_text(pair: dict) -> str:
    if pair["n"] == 0:
        return MISSING
    if pair["low"] is None:
        return f"{_fmt(pair['mean'], True)} (n={pair['n']}, no interval)"
    return f"{_fmt(pair['mean'], True)} [{_fmt(pair['low'], True)}, {_fmt(pair['high'], True)}] (n={pair['n']})"


def _arms(found: dict) -> list[str]:
    present = set(found["cells"]) | set(found["zeroshot"])
    return [*ARMS, *sorted(present - set(ARMS) - {BAG_OF_WORDS})]


def table(found: dict, seeds: Sequence[int]) -> dict:
    """{arm: {"task/budget/metric": {"n", "mean", "sd", "values": {seed: value}, "low", "high"}}}."""
    rows = {}
    for arm in [*_arms(found), BAG_OF_WORDS]:
        rows[arm] = {}
        for task, budget, metric, _ in CELLS:
            if arm == BAG_OF_WORDS and task not in ("sst2", "imdb"):
                continue
            values = seed_values(found, arm, task, budget, metric, seeds)
            interval = t_interval(list(values.values()))
            rows[arm][f"{task}/{budget}/{metric}"] = {**summary(list(values.values())), "values": values,
                                                     "low": interval[1] if interval else None,
                                                     "high": interval[2] if interval else None}
    return rows


def paired_gains(found: dict, seeds: Sequence[int]) -> dict:
    """{arm: {"task/budget/metric": paired(arm, its random arm)}} for every pre-trained arm."""
    gains = {}
    for arm, control in RANDOM_ARM.items():
        gains[arm] = {f"{t}/{b}/{m}": {**paired(seed_values(found, arm, t, b, m, seeds),
                                                seed_values(found, control, t, b, m, seeds)), "against": control}
                      for t, b, m, _ in CELLS}
    return gains


def endpoints(gains: dict, wanted: int) -> dict[str, list[dict]]:
    def judged(spec) -> dict:
        name, arm, task, budget, metric = spec
        pair = gains[arm][f"{task}/{budget}/{metric}"]
        return {"endpoint": name, "arm": arm, "against": RANDOM_ARM[arm], "task": task, "budget": budget,
                "metric": metric, **pair, "verdict": verdict(pair, wanted)}

    return {"primary": [judged(spec) for spec in PRIMARY], "secondary": [judged(spec) for spec in SECONDARY]}


def objective_comparison(found: dict, seeds: Sequence[int], heldout: Mapping[str, float]) -> dict:
    """MLM only against MLM + NSP at 60 minutes on the domain corpus: held-out MLM accuracy, and endpoint (a)."""
    objectives = {}
    for arm in OBJECTIVE_ARMS:
        records = [r for cell in found["cells"].get(arm, {}).values() for r in cell.values()]
        objectives[arm] = records[0].get("objective") if records else None
    first, other = OBJECTIVE_ARMS
    return {"objectives": objectives, "heldout_mlm_acc": {arm: heldout.get(arm) for arm in OBJECTIVE_ARMS},
            "sst2_1000": paired(seed_values(found, first, "sst2", "1000", "acc", seeds),
                                seed_values(found, other, "sst2", "1000", "acc", seeds))}


def read_curves(pretrain_runs: Mapping[str, Path] | None) -> dict[str, list[tuple[int, float]] | None]:
    from pipeline.core.run.curves import read_metrics
    from pipeline.core.run.loggers import csv_metrics_path

    curves = {}
    for name, run in (pretrain_runs or {}).items():
        path = csv_metrics_path(run)
        curves[name] = read_metrics(path).get("val/mlm_acc", []) if path.is_file() else None
    return curves


def search_results(out: Path) -> dict[str, dict]:
    """The recipe search as its runs left it: {corpus: {"tries": {try: its DONE record}, "choice": choice.json or
    None}}, the tries in the protocol's order (study_recipe.TRIES), then any other in name order."""
    found = {}
    for corpus_dir in sorted(path for path in (Path(out) / "search").glob("*") if path.is_dir()):
        done = finished_tries(out, corpus_dir.name)
        order = [name for name in TRIES if name in done] + sorted(set(done) - set(TRIES))
        choice = corpus_dir / "choice.json"
        found[corpus_dir.name] = {
            "tries": {name: done[name] for name in order},
            "choice": json.loads(choice.read_text(encoding="utf-8")) if choice.is_file() else None}
    return found


def missing_list(rows: dict, found: dict, curves: dict, wanted: int) -> list[str]:
    missing = []
    for arm, cells in rows.items():
        short = [f"{key} ({cell['n']} of {wanted} seeds)" for key, cell in cells.items() if cell["n"] < wanted]
        no_zeroshot = arm != BAG_OF_WORDS and arm not in found["zeroshot"]
        if all(cell["n"] == 0 for cell in cells.values()) and (no_zeroshot or arm == BAG_OF_WORDS):
            missing.append(f"{arm}: no results at all")
            continue
        if short:
            missing.append(f"{arm}: " + ", ".join(short))
        if no_zeroshot:
            missing.append(f"{arm}: zero-shot SST-2")
    missing += [f"pre-training run {name}: no csv/metrics.csv" for name, points in curves.items() if points is None]
    return missing


def _figure_series(rows: dict) -> dict:
    series = {}
    for arm, cells in rows.items():
        series[arm] = {}
        for task, budget in FIGURE_CELLS:
            cell = cells.get(f"{task}/{budget}/acc")
            if cell:
                series[arm][f"{task}/{budget}"] = {**cell, "values": list(cell["values"].values())}
    return series


def build_report(out: Path, pretrain_runs: Mapping[str, Path] | None = None, seeds: Sequence[int] | None = None,
                 heldout_mlm: Mapping[str, float] | None = None) -> Path:
    out = Path(out)
    found = collect(out)
    records = [r for arm in found["cells"].values() for cell in arm.values() for r in cell.values()]
    quick = any(r.get("quick") for r in records) or any(r.get("quick") for r in found["zeroshot"].values())
    seeds = tuple(seeds) if seeds is not None else ((1,) if quick else SEEDS)
    if heldout_mlm is None and (out / HELDOUT_FILE).is_file():
        heldout_mlm = json.loads((out / HELDOUT_FILE).read_text(encoding="utf-8"))
    rows, gains = table(found, seeds), paired_gains(found, seeds)
    judged = endpoints(gains, len(seeds))
    comparison = objective_comparison(found, seeds, heldout_mlm or {})
    curves = read_curves(pretrain_runs)
    report_dir = out / "report"
    figures = {
        "score_vs_labels": score_against_labels(_figure_series(rows), report_dir / "score_vs_labels.png"),
        "gains_vs_labels": gains_against_labels(
            {arm: {f"{t}/{b}": cells[f"{t}/{b}/acc"] for t, b in FIGURE_CELLS} for arm, cells in gains.items()},
            report_dir / "gains_vs_labels.png"),
        "mlm_curves": mlm_curves({n: p for n, p in curves.items() if p}, report_dir / "mlm_curves.png"),
    }
    results = {"quick": quick, "seeds": list(seeds), "t_quantile": t_quantile(len(seeds)) if len(seeds) > 1 else None,
               "table": rows, "paired": gains, "endpoints": judged, "zeroshot": found["zeroshot"],
               "rates": found["rates"], "objective_comparison": comparison,
               "mlm_curves": curves, "search": search_results(out),
               "missing": missing_list(rows, found, curves, len(seeds)),
               "figures": {name: path.name for name, path in figures.items()}}
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
    (report_dir / "report.md").write_text(markdown(results) + "\n", encoding="utf-8")
    return report_dir / "report.md"


def markdown(results: dict) -> str:
    seeds, wanted = results["seeds"], len(results["seeds"])
    lines = ["# Does our pre-training pay on real text? The downstream comparison", ""]
    if results["quick"]:
        lines += ["**A quick run (bench_downstream.py --quick): tiny models, one epoch, cut sets; its "
                  "numbers only show that the chain runs.**", ""]
    t_note = f", t = {results['t_quantile']:.4f}" if results["t_quantile"] else ""
    lines += [f"Seeds {', '.join(map(str, seeds))}; each cell the mean ± sample sd over them. Intervals: 95% t "
              f"(mean ± t × sd / √n{t_note}).", ""]
    labels = [label for *_, label in CELLS]
    lines += ["| arm | " + " | ".join(labels) + " | zero-shot SST-2 |", "|---|" + "---|" * (len(labels) + 1)]
    for arm, cells in results["table"].items():
        texts = [_cell_text(cells[f"{t}/{b}/{m}"], wanted) if f"{t}/{b}/{m}" in cells else "—" for t, b, m, _ in CELLS]
        zero = results["zeroshot"].get(arm)
        zero_text = "—" if arm == BAG_OF_WORDS else (_fmt(zero["accuracy"]) if zero else MISSING)
        lines.append(f"| {arm} | " + " | ".join(texts) + f" | {zero_text} |")
    lines += ["", f"CoLA cannot move at this size: Turc et al.'s fully pre-trained BERT-tiny scores "
              f"{TURC_TINY_COLA} MCC on it; it is reported, not an endpoint.", ""]
    lines += _rates_lines(results["rates"])
    lines += ["## Paired gains over random initialisation (same vocabulary, same subsets and seeds)", "",
              "| arm | against | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
    for arm, cells in results["paired"].items():
        against = next(iter(cells.values()))["against"]
        lines.append(f"| {arm} | {against} | " + " | ".join(_pair_text(cells[f'{t}/{b}/{m}'])
                                                            for t, b, m, _ in CELLS) + " |")
    lines += ["", "## Primary endpoints (met when the 95% interval of the paired gain lies above 0)", ""]
    lines += [_endpoint_line(e) for e in results["endpoints"]["primary"]]
    lines += ["", "## Secondary", "", "The same three at 60 minutes:", ""]
    lines += [_endpoint_line(e) for e in results["endpoints"]["secondary"]]
    lines += ["", *_zeroshot_lines(results["zeroshot"]), *_objective_lines(results["objective_comparison"])]
    lines += _search_lines(results["search"], results["quick"])
    lines += ["## Figures", "", f"![score against labels]({results['figures']['score_vs_labels']})", "",
              f"![paired gains]({results['figures']['gains_vs_labels']})", "",
              f"![held-out MLM accuracy]({results['figures']['mlm_curves']})", ""]
    lines += ["## Missing", ""] + ([f"- {m}" for m in results["missing"]] or ["Nothing."])
    return "\n".join(lines)


def _endpoint_line(e: dict) -> str:
    return (f"- ({e['endpoint']}) {e['arm']} against {e['against']}, {e['task']} {e['budget']} {e['metric']}: "
            f"{_pair_text(e)}: **{e['verdict']}**")


def _rates_lines(rates: dict) -> list[str]:
    tasks = ("sst2", "imdb", "stsb", "cola")
    lines = ["## Rates chosen on the rate-selection slices (never dev)", "", "| arm | " + " | ".join(tasks) + " |",
             "|---|" + "---|" * len(tasks)]
    order = [*ARMS, *sorted(set(rates) - set(ARMS) - {BAG_OF_WORDS}), BAG_OF_WORDS]
    for arm in order:
        chosen = rates.get(arm, {})
        cells = []
        for task in tasks:
            record = chosen.get(task)
            if record is None:
                cells.append("—" if arm == BAG_OF_WORDS and task not in ("sst2", "imdb") else MISSING)
                continue
            scores = ", ".join(f"{k}: {_fmt(v)}" for k, v in (record.get("scores") or {}).items())
            cells.append(f"{record['parameter']} {record['chosen']:g}" + (f" ({scores})" if scores else ""))
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _zeroshot_lines(zeroshot: dict) -> list[str]:
    lines = ["Zero-shot SST-2 by the MLM head (`<sentence> it was [MASK] .`, median threshold, no labels used; one "
             "value per arm):", "", "| arm | accuracy | minus its random arm's | words split (scored by their first "
             "piece) | encoder |", "|---|---|---|---|---|"]
    for arm in [a for a in ARMS if a in zeroshot] + sorted(set(zeroshot) - set(ARMS)):
        record = zeroshot[arm]
        split = ", ".join(f"{w} -> {' '.join(record['words'][w]['pieces'])}" for w in record["split_words"]) or "none"
        control = zeroshot.get(RANDOM_ARM.get(arm, ""))
        gain = _fmt(record["accuracy"] - control["accuracy"], True) if control else ("—" if arm not in RANDOM_ARM
                                                                                      else MISSING)
        lines.append(f"| {arm} | {_fmt(record['accuracy'])} | {gain} | {split} | {record['init']} |")
    return [*lines, ""]


def _objective_lines(comparison: dict) -> list[str]:
    first, other = OBJECTIVE_ARMS
    objectives = comparison["objectives"]
    heldout = comparison["heldout_mlm_acc"]
    lines = [f"MLM only against MLM + NSP at 60 minutes, domain corpus: {first} ({objectives[first] or 'not run'}) "
             f"against {other} ({objectives[other] or 'not run'}).", ""]
    if heldout.get(first) is not None and heldout.get(other) is not None:
        lines.append(f"- held-out MLM accuracy on the MLM-only held-out set: {_fmt(heldout[first])} against "
                     f"{_fmt(heldout[other])} ({_fmt(heldout[first] - heldout[other], True)})")
    else:
        lines.append(f"- held-out MLM accuracy on the MLM-only held-out set: {MISSING} ({HELDOUT_FILE})")
    lines += [f"- SST-2 at 1,000 labels, {first} - {other}, paired: {_pair_text(comparison['sst2_1000'])}", ""]
    return lines


def _search_lines(search: dict, quick: bool) -> list[str]:
    """The recipe search: held-out MLM accuracy and the selection probe per try and corpus, and each choice."""
    if not search:
        return ["## The recipe search", "", f"{MISSING}: no <out>/search/ runs", ""]
    corpora = list(search)
    names = list(dict.fromkeys(name for corpus in corpora for name in search[corpus]["tries"]))
    lines = ["## The recipe search (held-out MLM accuracy per try; the choice by the protocol's rule)", "",
             ("Each try: the quick run's tiny budget." if quick else f"Each try: {TRY_MINUTES} minutes of this machine "
              "turned into steps by its shape's measured speed.") + " Held-out "
             "MLM accuracy on the try's own corpus's held-out set; selection probe: logistic regression on frozen "
             "mean-pooled features, SST-2 training rows 1-1,000 against rows 1,001-2,000 (never dev).", "",
             "| try | " + " | ".join(f"{c}: steps | {c}: held-out MLM acc | {c}: selection probe" for c in corpora)
             + " |", "|---|" + "---|---|---|" * len(corpora)]
    for name in names:
        cells = []
        for corpus in corpora:
            record = search[corpus]["tries"].get(name)
            cells += ([f"{record['steps']:,}", _fmt(record["heldout_mlm_acc"]), _fmt(record["selection_probe"])]
                      if record else [MISSING] * 3)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    for corpus in corpora:
        choice = search[corpus]["choice"]
        if choice is None:
            lines.append(f"- {corpus}: no choice yet ({MISSING}: search/{corpus}/choice.json)")
            continue
        recipe = ", ".join(f"{k} {v}" for k, v in choice["recipe"].items())
        lines.append(f"- {corpus}: {recipe}; " + "; ".join(choice["reasons"]))
    return [*lines, ""]
