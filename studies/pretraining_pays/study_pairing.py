"""The second protocol's fine-tuning (evidence_protocol.md, sections 3 and 4): a pre-trained arm against its random
arm on a few cells, each arm's rate chosen on the rate ladder until it is interior.

    choose_on_ladder(score)                       -> (rate, {rate: score}): the rule of section 3
    run_pairing(pairing, shared_data, out)        every rate try and cell of both arms, each written once

A Pairing names the two arms, the export the random arm is drawn like, the fine-tuning seeds, and the torch seed of
the random encoder of each fine-tuning seed (the replication's 100 x p + f; the remedy arm's f); the rate selection
fine-tunes with seed 0 (its random encoder: random_seed(0)). Results go where study_results puts the first study's
(<out>/finetune/<arm>/...), so its reader (collect) reads both.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from study_data import SELECTION_BUDGET, SELECTION_SEED, StudyData
from study_results import finetune_root, rate_choice_path, rate_try_path, read_done, result_path, write_json
from study_tasks import QUICK_RATE, SELECTION_METRIC, epochs_for, finite_or_low, random_export, run_finetune

START = (1e-4, 3e-4, 1e-3)
LADDER = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
CELL_METRIC = SELECTION_METRIC   # a cell is scored by the metric its rate is chosen on


def choose_on_ladder(score: Callable[[float], float]) -> tuple[float, dict[float, float]]:
    """Scores START; while the best is the highest rate tried (the lowest), scores the next rate up (down) the
    LADDER, until the best is interior or at the ladder's end. Of equal scores the lower rate; a NaN never wins."""
    scores = {rate: score(rate) for rate in START}
    while True:
        tried = sorted(scores)
        chosen = max(tried, key=lambda rate: finite_or_low(scores[rate]))   # the first of equals: the lowest
        step = LADDER.index(chosen)
        if chosen == tried[-1] and step + 1 < len(LADDER):
            scores[LADDER[step + 1]] = score(LADDER[step + 1])
        elif chosen == tried[0] and step > 0:
            scores[LADDER[step - 1]] = score(LADDER[step - 1])
        else:
            return chosen, scores


@dataclasses.dataclass(frozen=True)
class Pairing:
    pretrained: str                          # the pre-trained arm's name
    random: str                              # its random arm's name
    export: Path                             # the pre-trained arm's Hugging Face export
    seeds: tuple[int, ...]                   # fine-tuning seeds
    random_seed: Callable[[int], int]        # fine-tuning seed -> torch seed of the random encoder
    cells: tuple[tuple[str, int | str], ...]  # (task, label budget)
    description: str = ""                    # what the pairing is, in its result files

    def weights(self, arm: str, seed: int, out: Path) -> Path:
        if arm == self.pretrained:
            return self.export
        torch_seed = self.random_seed(seed)
        return random_export(self.export, torch_seed, finetune_root(out) / arm / "init" / f"seed{torch_seed}")

    def init(self, arm: str, seed: int) -> str:
        if arm == self.pretrained:
            return str(self.export)
        return f"random initialisation (torch seed {self.random_seed(seed)}) of the architecture of {self.export}"


def _rate(pairing: Pairing, arm: str, task: str, data: StudyData, out: Path, quick: bool) -> float:
    path = rate_choice_path(out, arm, task)
    done = read_done(path, quick)
    if done:
        return float(done["chosen"])
    files = data.selection(task)

    def score(lr: float) -> float:
        try_path = rate_try_path(out, arm, task, lr)
        made = read_done(try_path, quick)
        if not made:
            run_dir = finetune_root(out) / arm / "runs" / f"rate-{task}-lr{lr:g}"
            made = run_finetune(files, pairing.weights(arm, SELECTION_SEED, out), lr,
                                epochs_for(task, SELECTION_BUDGET[task], quick), SELECTION_SEED, run_dir,
                                finetune_root(out) / "cache")
            made = {"arm": arm, "task": task, "quick": quick, "seed": SELECTION_SEED,
                    "init": pairing.init(arm, SELECTION_SEED), **made}
            write_json(try_path, made)
        return float(made["metrics"][SELECTION_METRIC[task]])

    if quick:
        chosen, scores = QUICK_RATE, {}
    else:
        chosen, scores = choose_on_ladder(score)
    at_end = chosen in (LADDER[0], LADDER[-1])
    write_json(path, {"arm": arm, "task": task, "quick": quick, "parameter": "lr", "metric": SELECTION_METRIC[task],
                      "rule": "evidence_protocol.md, section 3: the ladder until the chosen rate is interior",
                      "start": list(START), "ladder": list(LADDER), "scores": {f"{k:g}": v for k, v in scores.items()},
                      "chosen": chosen, "chosen_at_the_ladders_end": at_end, "seed": SELECTION_SEED,
                      "init": pairing.init(arm, SELECTION_SEED), "eval_set": files.eval_name})
    print(f"{arm} {task}: rate {chosen:g} of {sorted(scores)}{' (at the ladder end)' if at_end else ''}", flush=True)
    return chosen


def run_pairing(pairing: Pairing, shared_data: Path, out: Path, quick: bool = False) -> None:
    """Both arms' rates, then every cell seed by seed (both arms of a seed together, so a stopped sitting leaves
    whole pairs behind it)."""
    data = StudyData(shared_data, finetune_root(out) / "data", quick)
    arms = (pairing.pretrained, pairing.random)
    rates = {(arm, task): _rate(pairing, arm, task, data, out, quick) for task, _ in pairing.cells for arm in arms}
    for seed in pairing.seeds:
        for task, budget in pairing.cells:
            files = data.split(task, budget, seed)
            for arm in arms:
                path = result_path(out, arm, task, budget, seed)
                if read_done(path, quick):
                    continue
                lr = rates[arm, task]
                made = run_finetune(files, pairing.weights(arm, seed, out), lr, epochs_for(task, budget, quick), seed,
                                    finetune_root(out) / arm / "runs" / f"{task}-{budget}-seed{seed}",
                                    finetune_root(out) / "cache")
                write_json(path, {"arm": arm, "task": task, "budget": str(budget), "seed": seed, "quick": quick,
                                  "init": pairing.init(arm, seed), "pairing": pairing.description, **made})
                value = made["metrics"][CELL_METRIC[task]]
                print(f"{arm} {task} {budget} seed {seed}: {CELL_METRIC[task]} {value:.4f} (lr {lr:g}, "
                      f"{made['seconds']} s)", flush=True)
