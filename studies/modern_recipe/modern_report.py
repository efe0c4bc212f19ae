"""protocol.md's report, rebuilt from <out> alone: each arm's budget (steps and tokens from its calibrated speed), each
run's held-out MLM accuracy, its held-out curve and plateau exit, each arm's gains over its random twins with the
protocol's intervals, every rate the ladder tried, the primary endpoint's verdict. What has not finished is shown as
not finished; nothing is left out for what it shows.

    build_report(out, quick)   -> <out>/report/report.md and results.json
"""
from __future__ import annotations

import json
from pathlib import Path

import earlier_study  # noqa: F401  (the first studies' modules on the path)
from benchmarks_common import metrics_rows
from modern_arms import CELLS, MODERN, PRIMARY_CELL, QUICK_FINETUNE_SEEDS, SEQ, TINY, budget
from study_evidence import GENERAL_STEPS, exit_step, highest_window
from study_pairing import CELL_METRIC
from study_recipe import BATCH
from study_record import RECORD as FIRST_RECORD
from study_results import collect
from study_stats import paired, two_level, two_level_verdict

CELL_NAMES = {("stsb", "full"): "STS-B Pearson (full training set)", ("sst2", "1000"): "SST-2 at 1,000 labels"}
FINETUNE_SEEDS_PER_RUN = 5
TOKENS_PER_STEP = BATCH * SEQ   # both arms: 32 full rows of 128 tokens a step (protocol, section 3)


def _fmt(mean, low=None, high=None) -> str:
    if mean is None:
        return "—"
    return f"{mean:+.4f}" if low is None else f"{mean:+.4f} [{low:+.4f}, {high:+.4f}]"


def _values(cells: dict, arm: str, cell: tuple[str, str]) -> dict[int, float]:
    return {seed: float(record["metrics"][CELL_METRIC[cell[0]]])
            for seed, record in cells.get(arm, {}).get(cell, {}).items()}


def reading(found: dict) -> str:
    """protocol.md section 6's decision rule, once the verdict is decided: where the interval over runs lies."""
    if found["verdict"] not in ("met", "not met"):
        return found["verdict"]
    runs = found["over_runs"]
    if runs["low"] > 0:
        return "above 0: the modern recipe makes general text pay on STS-B at this budget and size"
    if runs["high"] < 0:
        return "below 0: the pre-trained encoder is worse than random initialisation on STS-B"
    return "containing 0: a gain is not shown"


def heldout_curve(run: Path) -> list[tuple[int, float]]:
    """(step, held-out MLM accuracy) at each validation, read by the pipeline's own metrics reader: a step validated
    twice counts once, as last logged (a resumed run logs again what its stopped process had logged past its
    checkpoint; protocol, amendment 2)."""
    from pipeline.core.run.curves import read_metrics
    from pipeline.core.run.loggers import csv_metrics_path

    return read_metrics(csv_metrics_path(run)).get("val/mlm_acc", [])


def run_summary(out: Path, name: str) -> dict:
    run = out / "pretrain" / name
    if not (run / "DONE").is_file():
        return {"run": name, "finished": False}
    done = json.loads((run / "DONE").read_text())
    rows = metrics_rows(run)
    exit_at = exit_step(rows)
    return {"run": name, "finished": True, "steps": done["steps"], "tokens": done["steps"] * TOKENS_PER_STEP,
            "heldout_mlm_acc": done["heldout_mlm_acc"], "heldout_curve": heldout_curve(run),
            "exit_step": exit_at, "exit_share": None if exit_at is None else (exit_at + 1) / done["steps"],
            "highest_window": highest_window(rows)}


def budget_lines(calibration: dict, steps: dict[str, int | None]) -> list[str]:
    """Each arm's measured speed and the steps and tokens it makes of the 120 minutes, the first study's beside."""
    lines = []
    for measured in calibration.values():
        arm_steps = steps.get(measured["arm"])
        made = "" if arm_steps is None else f": {arm_steps:,} steps, {arm_steps * TOKENS_PER_STEP / 1e6:.1f} M tokens"
        lines.append(f"- {measured['arm']}: {measured['steps_per_minute']:.1f} steps a minute (measured "
                     f"{measured['measured']}, 1-minute load before {measured['load_before']:.2f}){made}")
    lines.append(f"- beside, not pooled: the first study's general_120 (BERT-tiny, MLM+NSP) had {GENERAL_STEPS:,} "
                 f"steps, recovered from a replaced machine's calibration")
    return lines


def rate_lines(rates: dict[str, dict], names: list[str]) -> list[str]:
    """Every rate the ladder tried for each run and twin, on each cell's rate-selection slice, and the one chosen."""
    lines = ["| run or twin | " + " | ".join(f"{CELL_NAMES[(task, str(b))]}: chosen (every try)" for task, b in CELLS)
             + " |", "|---|" + "---|" * len(CELLS)]
    for name in names:
        cells = []
        for task, _ in CELLS:
            found = rates.get(name, {}).get(task)
            if found is None:
                cells.append("not finished")
                continue
            tries = ", ".join(f"{float(lr):g} {score:.4f}" for lr, score in sorted(found["scores"].items(),
                                                                                key=lambda item: float(item[0])))
            cells.append(f"{found['chosen']:g} ({tries})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def arm_gains(cells: dict, arm, runs: tuple[int, ...], cell: tuple[str, str], seeds_per_run: int) -> dict:
    """Per run: the paired gain over its twin (interval over its fine-tuning seeds, study_stats.paired); over the runs:
    study_stats.two_level (the t interval over the runs' mean gains) and its verdict."""
    per_run, differences = {}, {}
    for run in runs:
        pair = paired(_values(cells, arm.run_name(run), cell), _values(cells, arm.random_name(run), cell))
        per_run[run] = pair
        if pair["n"]:
            differences[run] = dict(zip(pair["seeds"], pair["differences"]))
    over_runs = two_level(differences) if differences else None
    verdict = two_level_verdict(over_runs, len(runs), seeds_per_run) if over_runs else "undecided: no results"
    return {"per_run": per_run, "over_runs": over_runs, "verdict": verdict}


def first_study_general(cell: tuple[str, str]) -> dict:
    """The first study's general_120 against random_general on the same cell, from its record (one run)."""
    cells = collect(FIRST_RECORD)["cells"]
    return paired(_values(cells, "general_120", cell), _values(cells, "random_general", cell))


def build_report(out: Path, quick: bool) -> Path:
    found_results = collect(out)
    cells = found_results["cells"]
    seeds_per_run = QUICK_FINETUNE_SEEDS if quick else FINETUNE_SEEDS_PER_RUN
    calibration = json.loads((out / "calibration.json").read_text()) if (out / "calibration.json").is_file() else {}
    results = {"quick": quick, "calibration": calibration, "runs": {}, "gains": {}, "first_study_general_120": {}}
    lines = [f"# The modern recipe on general text: report{' (QUICK: tiny scale, not the study)' if quick else ''}",
             "", "## Pre-training runs", "",
             "| run | steps | tokens | held-out MLM accuracy (15% set) | plateau exit (step, share of steps) | "
             "highest window |", "|---|---|---|---|---|---|"]
    for arm in (MODERN, TINY):
        runs = arm.seeds(quick)
        steps = budget(out, arm, quick) if calibration else None
        results["runs"][arm.name] = {"budget_steps": steps, "runs": [run_summary(out, arm.run_name(r)) for r in runs]}
        for summary in results["runs"][arm.name]["runs"]:
            if not summary["finished"]:
                lines.append(f"| {summary['run']} | not finished | — | — | — | — |")
                continue
            exit_text = ("none" if summary["exit_step"] is None
                         else f"{summary['exit_step']:,} ({summary['exit_share']:.0%})")
            window = "—" if summary["highest_window"] is None else f"{summary['highest_window']:.4f}"
            lines.append(f"| {summary['run']} | {summary['steps']:,} | {summary['tokens'] / 1e6:.1f} M | "
                         f"{summary['heldout_mlm_acc']:.4f} | {exit_text} | {window} |")
    lines += ["", "Budget: 120 minutes of each arm's own measured speed (protocol, section 4).", ""]
    lines += budget_lines(calibration, {name: arm["budget_steps"] for name, arm in results["runs"].items()})
    lines += ["", "## Held-out MLM accuracy at each validation (step: accuracy, the 15% set)", ""]
    for arm in results["runs"].values():
        for summary in arm["runs"]:
            curve = summary.get("heldout_curve")
            text = "; ".join(f"{step + 1:,}: {acc:.4f}" for step, acc in curve) if curve else "not finished"
            lines.append(f"- {summary['run']}: {text}")
    lines += ["", "## Gains over the random twins", "",
              "| arm | cell | per run: gain [95% t over its fine-tuning seeds] | over runs [95% t over runs] | "
              "between / within sd | bootstrap | verdict |", "|---|---|---|---|---|---|---|"]
    for arm in (MODERN, TINY):
        for task, label_budget in CELLS:
            cell = (task, str(label_budget))
            found = arm_gains(cells, arm, arm.seeds(quick), cell, seeds_per_run)
            results["gains"].setdefault(arm.name, {})[f"{task}/{label_budget}"] = found
            per_run = "; ".join(f"p{run} {_fmt(p['mean'], p['low'], p['high'])}" for run, p in found["per_run"].items())
            runs = found["over_runs"] or {}
            spread = (f"{runs['sd']:.4f} / {runs['within_sd']:.4f}" if runs.get("sd") is not None
                      and runs.get("within_sd") is not None else "—")
            boot = (_fmt(None) if runs.get("bootstrap_low") is None
                    else f"[{runs['bootstrap_low']:+.4f}, {runs['bootstrap_high']:+.4f}]")
            lines.append(f"| {arm.name} | {CELL_NAMES[cell]} | {per_run} | "
                         f"{_fmt(runs.get('mean'), runs.get('low'), runs.get('high'))} | {spread} | {boot} | "
                         f"{found['verdict']} |")
    primary = results["gains"][MODERN.name][f"{PRIMARY_CELL[0]}/{PRIMARY_CELL[1]}"]
    primary_reading = reading(primary)
    results["primary"] = {"arm": MODERN.name, "cell": list(PRIMARY_CELL), "verdict": primary["verdict"],
                          "reading": primary_reading}
    lines += ["", f"**Primary endpoint** (modern arm against its random twins, {CELL_NAMES[PRIMARY_CELL]}, the t "
              f"interval over its runs): **{primary['verdict']}**"
              + ("" if primary_reading == primary["verdict"] else f", {primary_reading}") + ".", ""]
    differences = {}
    for task, label_budget in CELLS:
        key = f"{task}/{label_budget}"
        means = [(results["gains"][arm.name][key]["over_runs"] or {}).get("mean") for arm in (MODERN, TINY)]
        differences[key] = None if None in means else means[0] - means[1]
        first = first_study_general((task, str(label_budget)))
        results["first_study_general_120"][key] = first
        lines.append(f"- {CELL_NAMES[(task, str(label_budget))]}: modern minus BERT-tiny mean gain "
                     f"{_fmt(differences[key])} (descriptive, no interval); the first study's general_120 (one run, "
                     f"the first check's corpus) {_fmt(first['mean'], first['low'], first['high'])}")
    results["modern_minus_tiny"] = differences
    names = [name for arm in (MODERN, TINY) for run in arm.seeds(quick)
             for name in (arm.run_name(run), arm.random_name(run))]
    results["rates"] = {name: found_results["rates"].get(name) for name in names}
    lines += ["", "## The rate ladder (seed 0, scored on each task's rate-selection slice, never on dev)", ""]
    lines += rate_lines(found_results["rates"], names)
    report_dir = out / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    path = report_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path

