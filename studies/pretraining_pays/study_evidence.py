"""The second protocol's arms (evidence_protocol.md, sections 3 and 4): the replication of domain_120 over three
pre-training seeds, the plateau tries, their selection rule and the remedy arm.

    replicate(out, shared_data, runs)     domain_120_p<p> trained (resumable), fine-tuned against random_domain_p<p>
    plateau(out, shared_data)             the 12 tries, the choice (plateau/choice.json), the remedy arm and its pairing
    exit_step(rows)                       the step a run left the plateau (None: it did not)
    highest_window(rows)                  how near it came to the threshold (descriptive)
    choose_remedy(tries)                  section 4's rule applied to the tries' DONE records
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

from benchmarks_common import metrics_rows
from study_pairing import Pairing, run_pairing
from study_recipe import train_for

DOMAIN_RECIPE = {"model": "tiny", "vocab": 16000, "seq": 128, "objective": "mlm_nsp", "lr": 2e-3}
GENERAL_RECIPE = {"model": "tiny", "vocab": 8000, "seq": 128, "objective": "mlm", "lr": 2e-3}
BATCH = 32
DOMAIN_STEPS = 34_400          # 120 minutes at the tiny, 16k, seq-128 shape's 1,720 steps in 6 minutes
GENERAL_STEPS = 46_150         # the first study's general_120 (120 minutes at 384.6 steps a minute)
PRETRAINING_SEEDS = (1, 2, 3)
REPLICATION_CELLS = (("sst2", 1000), ("imdb", 1000))
REMEDY_CELLS = (("stsb", "full"), ("sst2", 1000))
REMEDY_SEED = 3                # a seed no try used
REMEDY_FINETUNE_SEEDS = (1, 2, 3, 4, 5)

# Section 4: the first TRY_STEPS of the 120-minute general arm's schedule (in examples for batch 128), one change each
TRY_STEPS = 4000
TRY_SEEDS = (1, 2)
PLATEAU_TRIES = {
    "base": ({}, ()),
    "lr1e-3": ({"lr": 1e-3}, ()),
    "lr5e-4": ({"lr": 5e-4}, ()),
    "warmup20": ({}, ("scheduler.warmup_fraction=0.2",)),
    "batch128": ({"batch": 128}, ()),
    "init0.01": ({}, ("+model.initializer_range=0.01",)),
}
EXIT_ACCURACY, EXIT_WINDOW = 0.16, 4     # the mean of the last four logged training MLM accuracies (every 50 steps)


def finetune_seeds(run: int) -> tuple[int, ...]:
    """Fine-tuning seeds nested in pre-training seed `run`: 1-5, 6-10, 11-15."""
    return tuple(range(5 * (run - 1) + 1, 5 * run + 1))


def replication_pairing(out: Path, run: int) -> Pairing:
    return Pairing(f"domain_120_p{run}", f"random_domain_p{run}", out / "pretrain" / f"domain_120_p{run}" / "hf_export",
                   finetune_seeds(run), lambda seed: 100 * run + seed, REPLICATION_CELLS,
                   f"replication, pre-training seed {run} (evidence_protocol.md, section 3)")


def replicate(out: Path, shared_data: Path, runs: tuple[int, ...] = PRETRAINING_SEEDS,
              finished: Callable[[], None] = lambda: None) -> None:
    """Each run trained, then fine-tuned; `finished()` after each (the driver keeps the record)."""
    for run in runs:
        name = f"domain_120_p{run}"
        done = train_for(out, "domain", DOMAIN_RECIPE, out / "pretrain" / name, DOMAIN_STEPS, checkpoints=True,
                         seed=run)
        print(f"{name}: {DOMAIN_STEPS} steps, held-out MLM accuracy {done['heldout_mlm_acc']:.4f}, plateau exit at "
              f"step {exit_step(metrics_rows(out / 'pretrain' / name))}", flush=True)
        finished()
        run_pairing(replication_pairing(out, run), shared_data, out)
        finished()


def _window_means(rows: list[dict]) -> list[tuple[int, float]]:
    """(logged step, the mean of the last EXIT_WINDOW logged training MLM accuracies up to it), from the window's
    first full step on. A step logged twice counts once, as the last row has it: a run resumed from a checkpoint logs
    again the steps its stopped process had logged past it, and the file keeps both."""
    last = {int(row["step"]): float(row["train/mlm_acc"]) for row in rows if row.get("train/mlm_acc")}
    logged = sorted(last.items())
    return [(logged[k][0], statistics.fmean(acc for _, acc in logged[k - EXIT_WINDOW + 1:k + 1]))
            for k in range(EXIT_WINDOW - 1, len(logged))]


def exit_step(rows: list[dict]) -> int | None:
    """The first logged step at which the mean of the last EXIT_WINDOW logged training MLM accuracies passes
    EXIT_ACCURACY (section 4)."""
    return next((step for step, mean in _window_means(rows) if mean > EXIT_ACCURACY), None)


def highest_window(rows: list[dict]) -> float | None:
    """The highest of those means: how near a run that did not exit came to the threshold (descriptive; the rule
    reads exit_step only)."""
    return max((mean for _, mean in _window_means(rows)), default=None)


def _schedule(change: dict) -> tuple[dict, int, int]:
    """(recipe, the arm's steps, the try's steps): batch 128 takes a quarter of the steps for the same examples."""
    recipe = {**GENERAL_RECIPE, **change}
    scale = recipe.get("batch", BATCH) // BATCH
    return recipe, round(GENERAL_STEPS / scale), TRY_STEPS // scale


def run_tries(out: Path, finished: Callable[[], None] = lambda: None) -> dict[str, list[dict]]:
    """Every try at both seeds (each a run of its own, skipped once DONE); their DONE records with the exit added.
    `finished()` after each, so that a sitting which loses its machine keeps the tries it finished."""
    found: dict[str, list[dict]] = {}
    for name, (change, overrides) in PLATEAU_TRIES.items():
        recipe, arm_steps, steps = _schedule(change)
        for seed in TRY_SEEDS:   # the first `steps` of the arm's schedule
            run_dir = out / "plateau" / name / f"seed{seed}"
            done = train_for(out, "general", recipe, run_dir, steps, checkpoints=False, seed=seed,
                             extra=(f"scheduler.total_steps={arm_steps}", *overrides), validations=1)
            step = exit_step(metrics_rows(run_dir))
            scale = recipe.get("batch", BATCH) // BATCH
            found.setdefault(name, []).append({**done, "exit_step": step,
                                               "exit_examples_of_32": None if step is None else step * scale})
            print(f"plateau {name} seed {seed}: exit {step}, held-out MLM accuracy {done['heldout_mlm_acc']:.4f}",
                  flush=True)
            finished()
    return found


def choose_remedy(tries: dict[str, list[dict]]) -> dict:
    """Section 4's rule: a try's exit is the later of its seeds' (none if a seed never left); the earliest exit in
    examples wins, ties to the higher mean held-out MLM accuracy; none when no try left in both seeds."""
    ranked = []
    for name, runs in tries.items():
        exits = [run["exit_examples_of_32"] for run in runs]
        accuracy = statistics.fmean(run["heldout_mlm_acc"] for run in runs)
        if len(runs) == len(TRY_SEEDS) and None not in exits:
            ranked.append((max(exits), -accuracy, name))
    table = {name: {"exits_in_examples_of_32": [run["exit_examples_of_32"] for run in runs],
                    "heldout_mlm_acc": [run["heldout_mlm_acc"] for run in runs]} for name, runs in tries.items()}
    chosen = min(ranked)[2] if ranked else None
    return {"chosen": chosen, "tries": table, "rule": "evidence_protocol.md, section 4"}


def remedy_pairing(out: Path) -> Pairing:
    return Pairing("general_120_remedy", "random_general", out / "pretrain" / "general_120_remedy" / "hf_export",
                   REMEDY_FINETUNE_SEEDS, lambda seed: seed, REMEDY_CELLS,
                   "the plateau's remedy arm (evidence_protocol.md, section 4)")


NO_REMEDY = ("No try left the plateau at both seeds, so by section 4's rule the remedy arm (`general_120_remedy`) is "
             "not run and its endpoints are not measured.")


def plateau(out: Path, shared_data: Path, finished: Callable[[], None] = lambda: None) -> None:
    choice_file = out / "plateau" / "choice.json"
    if not choice_file.is_file():
        choice = choose_remedy(run_tries(out, finished))
        choice_file.write_text(json.dumps(choice, indent=1))
        finished()
    choice = json.loads(choice_file.read_text())
    print(f"plateau: the remedy is {choice['chosen']} ({choice['tries']})", flush=True)
    if choice["chosen"] is None:
        print(f"plateau: {NO_REMEDY}", flush=True)
        return
    change, overrides = PLATEAU_TRIES[choice["chosen"]]
    recipe, steps, _ = _schedule(change)
    run_dir = out / "pretrain" / "general_120_remedy"
    done = train_for(out, "general", recipe, run_dir, steps, checkpoints=True, seed=REMEDY_SEED, extra=overrides)
    print(f"general_120_remedy: {steps} steps, held-out MLM accuracy {done['heldout_mlm_acc']:.4f}, plateau exit at "
          f"step {exit_step(metrics_rows(run_dir))}", flush=True)
    finished()
    run_pairing(remedy_pairing(out), shared_data, out)
