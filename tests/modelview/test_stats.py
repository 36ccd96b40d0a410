"""Statistics: coverage of the median's CI, the significance test, multiple-testing adjustment."""

from __future__ import annotations

import numpy as np
import pytest

from nnforge.modelview.stats import (
    bootstrap_median_ci,
    compare_samples,
    holm,
    median_ci,
    percentiles,
    rel_halfwidth,
)


def test_median_ci_has_its_nominal_coverage_on_skewed_timings(rng: np.random.Generator):
    true_median = 1e-3  # lognormal(mu, s) has median exp(mu)
    hits = 0
    trials = 600
    for _ in range(trials):
        x = np.exp(rng.normal(np.log(true_median), 0.3, size=41))
        _, lo, hi = median_ci(x, 0.95)
        hits += lo <= true_median <= hi
    coverage = hits / trials
    assert 0.92 <= coverage <= 0.995, coverage  # exact binomial ranks: >= 95 %, a little above by discreteness


def test_median_ci_is_ordered_and_full_range_when_too_few_samples(rng: np.random.Generator):
    x = rng.exponential(size=5)
    med, lo, hi = median_ci(x)
    assert (lo, hi) == (x.min(), x.max()) and lo <= med <= hi
    x = rng.exponential(size=200)
    med, lo, hi = median_ci(x)
    assert x.min() < lo <= med <= hi < x.max()
    assert rel_halfwidth(med, lo, hi) == pytest.approx(max(med - lo, hi - med) / med)
    with pytest.raises(ValueError):
        median_ci([])


def test_ci_narrows_with_more_samples(rng: np.random.Generator):
    """Median width over 25 fresh samples per size: a single n = 20 interval is now and then narrower than an
    n = 200 one by chance (seen once in CI), the median of 25 practically never."""
    widths = []
    for n in (20, 200, 2000):
        cis = [median_ci(rng.normal(10, 1, size=n)) for _ in range(25)]
        widths.append(np.median([hi - lo for _, lo, hi in cis]))
    assert widths[0] > widths[1] > widths[2]


def test_bootstrap_ci_contains_the_sample_median(rng: np.random.Generator):
    x = rng.gamma(2.0, size=100)
    med, lo, hi = bootstrap_median_ci(x, seed=int(rng.integers(1 << 30)))
    assert lo <= med <= hi and med == pytest.approx(np.median(x))


def test_compare_detects_a_real_shift_and_its_size(rng: np.random.Generator):
    """A 10 % slowdown in lognormal timings: found every time (p tiny, CI above 1), its size estimated within six
    standard errors of the median ratio (~0.5 % here) every time, and the 95 % CI covering the true 1.10 about as
    often as it should. Coverage is a frequency, so it is checked over 200 trials (binomial sd ~1.5 %), not once."""
    trials, covered = 200, 0
    for _ in range(trials):
        a = np.exp(rng.normal(0, 0.05, size=300))
        b = 1.10 * np.exp(rng.normal(0, 0.05, size=300))
        c = compare_samples(a, b, n_boot=400, seed=int(rng.integers(1 << 30)))
        assert c.p < 1e-6 and c.ratio_ci[0] > 1.0
        assert abs(np.log(c.ratio / 1.10)) < 0.03, c
        covered += c.ratio_ci[0] < 1.10 < c.ratio_ci[1]
    assert 0.85 <= covered / trials <= 1.0, covered


def test_compare_is_rarely_significant_without_a_difference(rng: np.random.Generator):
    significant = sum(compare_samples(rng.normal(1, 0.1, 100), rng.normal(1, 0.1, 100)).p < 0.01 for _ in range(100))
    assert significant <= 6  # expected 1 at alpha = 0.01


def test_holm_matches_hand_computed_values():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5]) == [0.5]
    assert holm([0.9, 0.9]) == [1.0, 1.0]


def test_percentiles_keys():
    p = percentiles([1.0, 2.0, 3.0, 4.0])
    assert p["p50"] == 2.5 and p["min"] == 1.0 and p["max"] == 4.0
