"""study_stats.py: the paired 95% t-interval is scipy's, and the protocol's 2.776 for 5 seeds."""
from __future__ import annotations

import math

import pytest


@pytest.fixture(scope="module")
def stats(study_importable):
    import study_stats
    return study_stats


def test_the_paired_interval_is_scipys(stats):
    from scipy.stats import ttest_rel

    treated = {1: 0.71, 2: 0.68, 3: 0.74, 4: 0.70, 5: 0.69}
    control = {1: 0.66, 2: 0.67, 3: 0.69, 4: 0.61, 5: 0.68}
    pair = stats.paired(treated, control)
    expected = ttest_rel(list(treated.values()), list(control.values())).confidence_interval(0.95)
    assert pair["n"] == 5 and pair["seeds"] == [1, 2, 3, 4, 5]
    assert pair["low"] == pytest.approx(expected.low, abs=1e-12)
    assert pair["high"] == pytest.approx(expected.high, abs=1e-12)
    assert pair["mean"] == pytest.approx(0.042)
    # the protocol's form: mean ± 2.776 × sd / √5
    assert pair["mean"] - 2.776 * pair["sd"] / math.sqrt(5) == pytest.approx(pair["low"], abs=1e-4)
    assert round(stats.t_quantile(5), 3) == 2.776


def test_only_seeds_both_arms_have_are_paired(stats):
    pair = stats.paired({1: 0.7, 2: 0.8, 3: 0.9}, {2: 0.5, 3: 0.6, 4: 0.1})
    assert pair["seeds"] == [2, 3] and pair["differences"] == pytest.approx([0.3, 0.3])
    assert stats.paired({1: 0.7}, {1: 0.6})["low"] is None          # one pair: no interval


@pytest.mark.parametrize("treated, expected", [
    ({1: 0.71, 2: 0.72, 3: 0.70, 4: 0.73, 5: 0.71}, "met"),
    ({1: 0.71, 2: 0.60, 3: 0.70, 4: 0.63, 5: 0.71}, "not met"),        # the interval reaches below 0
    ({1: 0.71, 2: 0.72, 3: 0.70}, "undecided: 3 of 5 paired seeds"),
    ({1: float("nan"), 2: 0.72, 3: 0.70, 4: 0.73, 5: 0.71}, "undecided: no interval (a value is not a number)"),
])
def test_an_endpoint_is_met_only_when_the_whole_interval_is_above_zero(stats, treated, expected):
    control = {1: 0.65, 2: 0.66, 3: 0.64, 4: 0.66, 5: 0.65}
    assert stats.verdict(stats.paired(treated, control), needed=5) == expected


def test_a_gain_whose_interval_touches_zero_is_not_met(stats):
    # differences with mean exactly t * sd / sqrt(n): the lower bound is 0, not above it
    sd_unit = [1.0, -1.0, 0.0, 0.0, 0.0]
    spread = math.sqrt(sum(d * d for d in sd_unit) / 4)
    mean = stats.t_quantile(5) * spread / math.sqrt(5)
    control = {s: 0.0 for s in range(1, 6)}
    treated = {s: mean + d for s, d in zip(range(1, 6), sd_unit)}
    pair = stats.paired(treated, control)
    assert pair["low"] == pytest.approx(0.0, abs=1e-12)
    assert stats.verdict({**pair, "low": 0.0}, needed=5) == "not met"
