"""Statistics for timings: the confidence interval of a median, and whether two sets of timings differ.

Timings are skewed (a floor plus a tail of interruptions), so everything here is distribution-free: the CI of the
median from order statistics (exact binomial ranks), a bootstrap as an alternative, and Mann-Whitney U for "did it
change". The median, not the mean, is what the sweep reports: one preempted call does not move it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=4096)
def _median_rank(n: int, confidence: float) -> int:
    """Largest 0-based rank j with P(Binomial(n, 1/2) <= j) <= (1 - confidence) / 2, or -1 if none.

    Computed exactly in log space (no scipy import in the timing workers: it costs a second per process)."""
    half_alpha = (1.0 - confidence) / 2
    if n > 2000:  # normal approximation of the binomial; exact to within a rank at this size
        z = statistics.NormalDist().inv_cdf(1 - half_alpha)
        return max(-1, math.floor(n / 2 - z * math.sqrt(n) / 2 - 0.5))
    log_half_n = n * math.log(0.5)
    cdf = 0.0
    j = -1
    for k in range(n // 2 + 1):
        cdf += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + log_half_n)
        if cdf > half_alpha:
            break
        j = k
    return j


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high): a distribution-free CI of the median from order statistics.

    The number of samples below the true median is Binomial(n, 1/2); the ranks ``j < k`` are chosen so that
    P(j <= B < k) >= confidence. With too few samples for that (n < 6 at 95 %) the interval is the full range, which
    is honest: it is as wide as the data."""
    x = np.sort(np.asarray(samples, dtype=float))
    n = len(x)
    if n == 0:
        raise ValueError("no samples")
    med = float(np.median(x))
    j = _median_rank(n, confidence)
    if j < 0:
        return med, float(x[0]), float(x[-1])
    k = n - 1 - j
    return med, float(x[j]), float(x[k])


def bootstrap_median_ci(
    samples: Sequence[float], confidence: float = 0.95, n_boot: int = 2000, seed: int | None = None
) -> tuple[float, float, float]:
    """(median, low, high) by the percentile bootstrap; an alternative when order statistics are too coarse."""
    x = np.asarray(samples, dtype=float)
    rng = np.random.default_rng(seed)
    meds = np.median(rng.choice(x, size=(n_boot, len(x)), replace=True), axis=1)
    a = (1 - confidence) / 2
    return float(np.median(x)), float(np.quantile(meds, a)), float(np.quantile(meds, 1 - a))


def rel_halfwidth(med: float, lo: float, hi: float) -> float:
    """The larger side of the CI relative to the median: the figure the adaptive repeats drive below the target."""
    if med <= 0:
        return float("inf")
    return max(med - lo, hi - med) / med


def percentiles(samples: Sequence[float], qs: Sequence[float] = (5, 25, 50, 75, 95, 99)) -> dict[str, float]:
    x = np.asarray(samples, dtype=float)
    return {f"p{q:g}": float(np.percentile(x, q)) for q in qs} | {"min": float(x.min()), "max": float(x.max())}


@dataclass(frozen=True)
class Comparison:
    """B relative to A. ``ratio`` = median(B)/median(A) (<1: B is faster); ``ratio_ci`` its bootstrap CI;
    ``p`` the two-sided Mann-Whitney U p-value."""

    median_a: float
    median_b: float
    ratio: float
    ratio_ci: tuple[float, float]
    p: float
    n_a: int
    n_b: int


def compare_samples(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95, n_boot: int = 2000, seed: int | None = None
) -> Comparison:
    """Mann-Whitney U test and a bootstrap CI of the ratio of medians."""
    xa = np.asarray(a, dtype=float)
    xb = np.asarray(b, dtype=float)
    if len(xa) < 2 or len(xb) < 2:
        raise ValueError("need at least two samples on each side")
    from scipy import stats as sps

    p = float(sps.mannwhitneyu(xa, xb, alternative="two-sided").pvalue)
    rng = np.random.default_rng(seed)
    ma = np.median(rng.choice(xa, size=(n_boot, len(xa)), replace=True), axis=1)
    mb = np.median(rng.choice(xb, size=(n_boot, len(xb)), replace=True), axis=1)
    ratios = mb / ma
    q = (1 - confidence) / 2
    med_a, med_b = float(np.median(xa)), float(np.median(xb))
    return Comparison(
        median_a=med_a,
        median_b=med_b,
        ratio=med_b / med_a,
        ratio_ci=(float(np.quantile(ratios, q)), float(np.quantile(ratios, 1 - q))),
        p=p,
        n_a=len(xa),
        n_b=len(xb),
    )


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values: comparing many cells at once must not turn noise into 'significant'.
    A NaN (a pair that could not be tested) stays NaN and does not count as a test."""
    idx = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    out = [float("nan")] * len(pvalues)
    m = len(idx)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p of the Mann-Whitney U test, normal approximation with tie and continuity corrections (scipy's
    "asymptotic" method) in plain numpy: microseconds per pair where a scipy call costs ~100 µs, which the web
    view's comparison of two 10,000-cell runs cannot afford. NaN with fewer than two samples on a side."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n1, n2 = len(x), len(y)
    if n1 < 2 or n2 < 2:
        return float("nan")
    allv = np.concatenate([x, y])
    order = np.argsort(allv, kind="mergesort")
    sorted_v = allv[order]
    # average ranks of ties: rank = mean of the 1-based positions of each run of equal values
    _, start, counts = np.unique(sorted_v, return_index=True, return_counts=True)
    avg = start + (counts + 1) / 2.0
    ranks = np.empty(n1 + n2)
    ranks[order] = np.repeat(avg, counts)
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    tie = (counts**3 - counts).sum() / (n * (n - 1))
    sigma = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - tie))
    if sigma == 0:
        return 1.0
    mu = n1 * n2 / 2.0
    z = (abs(u1 - mu) - 0.5) / sigma
    return float(min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2.0))))
