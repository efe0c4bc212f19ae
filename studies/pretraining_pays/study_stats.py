"""The study's statistics (study_protocol.md, section 4): a cell's mean and sample standard deviation over
seeds, and the paired difference of two arms over the seeds both have, with its 95% t-interval
(mean ± t(0.975, n - 1) × sd / √n; for the protocol's 5 seeds t = 2.7764, the protocol's 2.776 rounded).

    summary([0.61, 0.64, ...])                      -> {"n", "mean", "sd"}
    paired({seed: value}, {seed: value})            -> {"n", "seeds", "differences", "mean", "sd", "low", "high"}
    verdict(pair, needed=5)                         -> "met" | "not met" | "undecided: ..."
    two_level({run: {seed: difference}})            -> the second protocol's interval over pre-training runs
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

CONFIDENCE = 0.95


def t_quantile(n: int) -> float:
    """The two-sided 95% quantile of Student's t with n - 1 degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.5 + CONFIDENCE / 2, n - 1))


def summary(values: Sequence[float]) -> dict:
    """{"n", "mean", "sd"}: the sample sd (n - 1); None where undefined. A NaN (a correlation of constant predictions)
    makes the mean NaN and the sd None: it is shown, never dropped."""
    values = list(values)
    if not values:
        return {"n": 0, "mean": None, "sd": None}
    if not all(math.isfinite(v) for v in values):
        return {"n": len(values), "mean": math.nan, "sd": None}
    return {"n": len(values), "mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else None}


def t_interval(values: Sequence[float]) -> tuple[float, float, float] | None:
    """(mean, low, high) of the 95% t-interval of the mean; None with fewer than 2 values or a non-finite one."""
    values = list(values)
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        return None
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    half = t_quantile(len(values)) * sd / math.sqrt(len(values))
    return mean, mean - half, mean + half


def paired(treated: Mapping[int, float], control: Mapping[int, float]) -> dict:
    """treated - control over the seeds both have, with the 95% t-interval of the mean difference."""
    seeds = sorted(set(treated) & set(control))
    differences = [treated[s] - control[s] for s in seeds]
    interval = t_interval(differences)
    found = {**summary(differences), "seeds": seeds, "differences": differences, "low": None, "high": None}
    if interval is not None:
        found["low"], found["high"] = interval[1], interval[2]
    return found


def verdict(pair: dict, needed: int) -> str:
    """An endpoint is met when the 95% interval of the paired gain lies above 0, over all `needed` seeds."""
    if pair["n"] < needed:
        return f"undecided: {pair['n']} of {needed} paired seeds"
    if pair["low"] is None:
        return "undecided: no interval (a value is not a number)"
    return "met" if pair["low"] > 0 else "not met"


BOOTSTRAP_DRAWS, BOOTSTRAP_SEED = 10_000, 0


def two_level(differences: Mapping[int, Mapping[int, float]]) -> dict:
    """The second protocol's statistics (evidence_protocol.md, section 3) of paired differences d(run, seed), the
    fine-tuning seeds nested in the pre-training runs: the mean of the runs' means with the 95% t-interval over those
    means (P - 1 degrees of freedom: the runs are the independent units, each mean carrying its seeds' noise); the
    between-run sd of the means and the within-run sd (root mean of the runs' variances); and a hierarchical bootstrap
    (runs resampled, then seeds within each) as a secondary interval."""
    import numpy as np

    runs = sorted(differences)
    values = {run: [differences[run][seed] for seed in sorted(differences[run])] for run in runs}
    means = [statistics.fmean(values[run]) for run in runs if values[run]]
    found = {"runs": runs, "seeds": {run: sorted(differences[run]) for run in runs}, "run_means": means,
             **summary(means), "low": None, "high": None, "within_sd": None, "bootstrap_low": None,
             "bootstrap_high": None}
    interval = t_interval(means)
    if interval is None:
        return found
    found["low"], found["high"] = interval[1], interval[2]
    variances = [statistics.variance(v) for v in values.values() if len(v) > 1]
    found["within_sd"] = math.sqrt(statistics.fmean(variances)) if variances else None
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    arrays = [np.asarray(values[run]) for run in runs]
    draws = np.empty(BOOTSTRAP_DRAWS)
    for k in range(BOOTSTRAP_DRAWS):
        picked = rng.integers(len(arrays), size=len(arrays))
        draws[k] = np.mean([rng.choice(arrays[i], size=len(arrays[i])).mean() for i in picked])
    found["bootstrap_low"], found["bootstrap_high"] = (float(q) for q in np.percentile(draws, [2.5, 97.5]))
    return found


def two_level_verdict(found: dict, runs: int, seeds: int) -> str:
    """Met when the primary interval lies above 0, over all `runs` runs of `seeds` seeds each."""
    complete = len(found["run_means"]) == runs and all(len(s) == seeds for s in found["seeds"].values())
    if not complete:
        return f"undecided: {len(found['run_means'])} of {runs} runs, seeds {found['seeds']}"
    if found["low"] is None:
        return "undecided: no interval (a value is not a number)"
    return "met" if found["low"] > 0 else "not met"
