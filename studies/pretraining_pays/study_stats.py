"""The study's statistics (study_protocol.md, section 4): a cell's mean and sample standard deviation over
seeds, and the paired difference of two arms over the seeds both have, with its 95% t-interval
(mean ± t(0.975, n - 1) × sd / √n; for the protocol's 5 seeds t = 2.7764, the protocol's 2.776 rounded).

    summary([0.61, 0.64, ...])                      -> {"n", "mean", "sd"}
    paired({seed: value}, {seed: value})            -> {"n", "seeds", "differences", "mean", "sd", "low", "high"}
    verdict(pair, needed=5)                         -> "met" | "not met" | "undecided: ..."
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
