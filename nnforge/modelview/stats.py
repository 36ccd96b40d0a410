"""Statistics for timings: the confidence interval of a median, and whether two sets of timings differ.

Timings are skewed (a floor plus a tail of interruptions), so everything here is distribution-free: the CI of the
median from order statistics (exact binomial ranks), a bootstrap as an alternative, and Mann-Whitney U for "did it
change". The median, not the mean, is what the sweep reports: one preempted call does not move it.
"""

from __future__ import annotations

import dataclasses
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


# --- Judging a change: independent units, not per-call samples -------------------------------------------------------
#
# Per-call samples of one process are not independent draws: a drifting machine shifts whole stretches of them, and two
# runs taken minutes apart differ by more than any per-call test allows (two runs of unchanged code were "significantly
# different" at p < 1e-10). What is independent is coarser: the rounds of one worker (all backends of a setting take
# turns in each, so a ratio inside a round cancels the machine's pace), and the worker processes. Everything below works
# on those units, and every consumer — ``nnforge compare``, ``nnforge ab``, ``nnforge history``, the report and the web
# view — asks ``judge`` for its verdict, so they cannot disagree.

VERDICTS = ("slower", "faster", "no change", "inconclusive")


@dataclass(frozen=True)
class Timing:
    """One cell's per-call samples with where each was taken: ``rounds[i]`` and ``processes[i]`` of sample i."""

    samples: tuple[float, ...]
    rounds: tuple[int, ...]
    processes: tuple[int, ...]


def timing_from(samples: Sequence[float], metrics: dict | None) -> Timing:
    """A ``Timing`` from a stored row: ``sample_rounds`` and ``process_sample_counts`` where the worker recorded them,
    else (older rows) consecutive groups of ``round_samples`` samples (5, the default) from a single process."""
    m = metrics or {}
    x = tuple(float(v) for v in samples)
    counts = m.get("process_sample_counts") or [len(x)]
    if sum(counts) != len(x):
        counts = [len(x)]
    procs = tuple(p for p, c in enumerate(counts) for _ in range(c))
    rounds_rec = m.get("sample_rounds")
    if isinstance(rounds_rec, list) and len(rounds_rec) == len(x):
        rounds = tuple(int(r) for r in rounds_rec)
    else:
        per = max(1, int(m.get("round_samples") or 5))
        rounds = tuple(i // per for c in counts for i in range(c))
    return Timing(x, rounds, procs)


def round_medians(t: Timing) -> dict[tuple[int, int], float]:
    """(process, round) -> median of that round's samples: one value per independent-ish unit."""
    groups: dict[tuple[int, int], list[float]] = {}
    for v, r, p in zip(t.samples, t.rounds, t.processes):
        groups.setdefault((p, r), []).append(v)
    return {k: float(np.median(v)) for k, v in groups.items() if v}


@dataclass(frozen=True)
class Estimate:
    """A figure in log space (log seconds, or log of the time relative to a baseline) with its standard error and
    degrees of freedom; ``units`` rounds from ``processes`` processes went into it. ``se_within`` / ``df_within`` are
    the rounds' part alone, before the spread between processes is added (``with_between``)."""

    log_value: float
    se: float
    df: float
    units: int
    processes: int
    process_values: tuple[float, ...] = ()
    se_within: float = float("inf")
    df_within: float = 0.0

    @property
    def value(self) -> float:
        return math.exp(self.log_value)

    @property
    def between_var(self) -> float:
        """This cell's own estimate of the variance between processes (0 when it cannot tell)."""
        k = len(self.process_values)
        if k < 2 or not math.isfinite(self.se_within):
            return 0.0
        return max(0.0, float(np.var(self.process_values, ddof=1)) - k * self.se_within**2)


def batch_means(values: Sequence[float], max_batches: int = 8) -> tuple[float, float, float]:
    """(mean, standard error, degrees of freedom) by non-overlapping batch means over consecutive rounds: neighbouring
    rounds share the machine's state, so their spread understates the error; the spread of batch medians does not
    (and a preempted round moves its batch's median little). Fewer than two rounds: an infinite error."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return (float(v.mean()) if len(v) else float("nan")), float("inf"), 0.0
    b = min(max_batches, len(v))
    means = np.array([np.median(chunk) for chunk in np.array_split(v, b)])
    return float(means.mean()), float(means.std(ddof=1) / math.sqrt(b)), float(b - 1)


def estimate(cell: Timing, baseline: Timing | None = None) -> Estimate:
    """The cell's log time per call, or — with ``baseline`` — its log time relative to the baseline backend round by
    round (only rounds both were timed in; the machine's pace cancels inside a round). Processes are combined by their
    mean; the error adds the spread between processes where there are at least two."""
    rc = round_medians(cell)
    rb = round_medians(baseline) if baseline is not None else None
    per_proc: dict[int, list[float]] = {}
    for (p, r), v in sorted(rc.items()):
        if v <= 0:
            continue
        if rb is None:
            per_proc.setdefault(p, []).append(math.log(v))
        elif rb.get((p, r), 0) > 0:
            per_proc.setdefault(p, []).append(math.log(v) - math.log(rb[(p, r)]))
    if not per_proc:
        return Estimate(float("nan"), float("inf"), 0.0, 0, 0)
    fits = [batch_means(v) for v in per_proc.values()]
    k = len(fits)
    means = [f[0] for f in fits]
    var_within = sum(f[1] ** 2 for f in fits) / k**2
    df_within = _satterthwaite([(f[1] ** 2 / k**2, f[2]) for f in fits])
    units = sum(len(v) for v in per_proc.values())
    e = Estimate(float(np.mean(means)), math.sqrt(var_within), df_within, units, k, tuple(means),
                 math.sqrt(var_within), df_within)
    return with_between(e, 0.0, 0.0)


def pooled_between(estimates: Sequence[Estimate]) -> tuple[float, float]:
    """(variance between processes, its degrees of freedom) pooled over the cells of one run that have several
    processes: a property of the machine and the run, which one cell's two or three processes estimate poorly
    (with one degree of freedom a 99 % interval is 64 standard errors wide)."""
    parts = [(e.between_var, len(e.process_values) - 1) for e in estimates if len(e.process_values) >= 2]
    df = sum(d for _, d in parts)
    if df == 0:
        return 0.0, 0.0
    return sum(v * d for v, d in parts) / df, float(df)


def with_between(e: Estimate, pooled_var: float, pooled_df: float) -> Estimate:
    """The estimate's error with the spread between processes added: the run's pooled variance, or the cell's own
    when its processes disagree more than that (then with its own few degrees of freedom)."""
    k = e.processes
    if k < 2:
        return e
    own = e.between_var
    var_b, df_b = (pooled_var, pooled_df) if pooled_var >= own and pooled_df > 0 else (own, float(k - 1))
    parts = [(e.se_within**2, e.df_within), (var_b / k, df_b)]
    return dataclasses.replace(e, se=math.sqrt(e.se_within**2 + var_b / k), df=_satterthwaite(parts))


def _satterthwaite(parts: Sequence[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variances (each with its own df); inf for known ones."""
    num = sum(v for v, _ in parts) ** 2
    den = 0.0
    for v, d in parts:
        if d <= 0:
            if v > 0 and math.isfinite(v):
                return 0.0
            continue
        if math.isfinite(d):
            den += v * v / d
    if not math.isfinite(num):
        return 0.0
    return float("inf") if den == 0 else num / den


@dataclass(frozen=True)
class Verdict:
    """B relative to A: ``change`` = time B / time A - 1 (negative: B is faster) with its ``ci`` at ``confidence``,
    and the ``verdict`` for a question asked at ``threshold`` (e.g. 0.02: "did it change by 2 % or more?")."""

    change: float
    ci: tuple[float, float]
    verdict: str
    threshold: float
    confidence: float
    noise_floor: float

    @property
    def text(self) -> str:
        if self.verdict == "no change":
            return f"no change within ±{100 * self.threshold:g} %"
        return self.verdict

    def regression(self, fail_on: float) -> bool:
        """A significant slowdown whose estimated size reaches ``fail_on`` (a CI gate: ``--fail-on 5%``)."""
        return self.verdict == "slower" and self.change >= fail_on

    def as_dict(self) -> dict[str, object]:
        return {"change": self.change, "ci": list(self.ci), "verdict": self.verdict, "text": self.text,
                "threshold": self.threshold, "confidence": self.confidence, "noise_floor": self.noise_floor}


def t_quantile(p: float, df: float) -> float:
    """Student t quantile (normal for df = inf); scipy is imported here only, never by the timing workers."""
    if not math.isfinite(df) or df > 1e6:
        return statistics.NormalDist().inv_cdf(p)
    if df <= 0:
        return float("inf")
    from scipy.stats import t

    return float(t.ppf(p, df))


def classify(lo: float, hi: float, threshold: float) -> str:
    """The verdict of an interval of relative change: beyond zero on one side → slower / faster (whatever its size);
    containing zero and inside ±threshold → no change; containing zero but wider than the question → inconclusive."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive"
    if lo > 0:
        return "slower"
    if hi < 0:
        return "faster"
    if -threshold <= lo and hi <= threshold:
        return "no change"
    return "inconclusive"


def judge_difference(log_diff: float, se: float, df: float, threshold: float = 0.02, confidence: float = 0.99,
                     noise_floor: float = 0.0) -> Verdict:
    """Verdict on a difference of log figures with standard error ``se``. ``noise_floor`` is the standard deviation
    (relative) of the figure between runs that the data cannot show (two runs with one process each); it is added to
    the error as a known term, never subtracted."""
    var = se * se + noise_floor * noise_floor
    parts = [(se * se, df), (noise_floor * noise_floor, float("inf"))]
    dof = _satterthwaite(parts) if se > 0 else float("inf")
    half = t_quantile(0.5 + confidence / 2, dof) * math.sqrt(var) if math.isfinite(var) else float("inf")
    if not math.isfinite(log_diff):
        lo = hi = float("nan")
    else:
        lo, hi = math.expm1(log_diff - half), math.expm1(log_diff + half)
    change = math.expm1(log_diff) if math.isfinite(log_diff) else float("nan")
    return Verdict(change, (lo, hi), classify(lo, hi, threshold), threshold, confidence, noise_floor)


def judge(a: Estimate, b: Estimate, threshold: float = 0.02, confidence: float = 0.99,
          noise_floor: float = 0.0) -> Verdict:
    """B's figure against A's, each from its own run (independent): their errors add, plus the between-run
    ``noise_floor`` unless both sides have repeated processes that measure it."""
    se = math.sqrt(a.se**2 + b.se**2)
    df = _satterthwaite([(a.se**2, a.df), (b.se**2, b.df)])
    floor = noise_floor if min(a.processes, b.processes) < 2 else 0.0
    return judge_difference(b.log_value - a.log_value, se, df, threshold, confidence, floor)


def judge_paired(cell: Timing, reference: Timing, threshold: float = 0.02, confidence: float = 0.99) -> Verdict:
    """B against A timed in the same rounds of the same workers (``nnforge ab``, history against a reference
    commit): the per-round ratio is the unit, and the machine's pace cancels inside each round."""
    e = estimate(cell, reference)
    return judge_difference(e.log_value, e.se, e.df, threshold, confidence)
