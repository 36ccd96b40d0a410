"""Judging a change from independent units (rounds, processes): the verdicts of ``stats.judge`` on synthetic timings
of a drifting machine, where the per-call test the comparison used before calls unchanged code "changed"."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from nnforge.modelview.compare import TimedCell, compare_cells
from nnforge.modelview.stats import (
    Timing,
    batch_means,
    classify,
    compare_samples,
    estimate,
    holm,
    judge,
    judge_difference,
    judge_paired,
    timing_from,
)


def drifting_run(rng: np.random.Generator, backends: dict[str, float], rounds: int = 40, per_round: int = 3,
                 processes: int = 1, noise: float = 0.03, drift: float = 0.25,
                 process_sd: float = 0.0) -> dict[str, Timing]:
    """Interleaved rounds on a machine whose pace wanders (a random walk of ±``drift`` in log space over the run and a
    fresh pace per process): every backend of a round sees the same pace, as in a worker."""
    out: dict[str, tuple[list, list, list]] = {b: ([], [], []) for b in backends}
    for p in range(processes):
        pace = rng.normal(0, drift)
        proc = {b: rng.normal(0, process_sd) for b in backends}
        for r in range(rounds):
            pace += rng.normal(0, drift / math.sqrt(rounds))
            for b, t in backends.items():
                for _ in range(per_round):
                    out[b][0].append(t * math.exp(pace + proc[b] + rng.normal(0, noise)))
                    out[b][1].append(r)
                    out[b][2].append(p)
    return {b: Timing(tuple(s), tuple(r), tuple(p)) for b, (s, r, p) in out.items()}


def cells(run: dict[str, Timing], setting: str) -> list[TimedCell]:
    return [TimedCell(f"{setting}|{b}", setting, b, setting, float(np.median(t.samples)), t) for b, t in run.items()]


def test_classify_never_calls_an_interval_that_excludes_zero_no_change():
    assert classify(-0.259, -0.147, 0.05) == "faster"  # the "same" for −21.6 % [−25.9, −14.7]
    assert classify(0.001, 0.004, 0.05) == "slower"  # tiny, but not zero
    assert classify(-0.03, 0.04, 0.05) == "no change"
    assert classify(-0.03, 0.08, 0.05) == "inconclusive"  # wider than the question
    assert classify(float("nan"), 0.01, 0.05) == "inconclusive"
    v = judge_difference(0.0, 0.004, 30, threshold=0.02)
    assert v.verdict == "no change" and v.text == "no change within ±2 %"


def test_unchanged_code_on_a_drifting_machine_is_no_false_alarm(rng):
    """60 settings, two runs each minutes apart: the per-call test flags most cells; the judged ratio almost none."""
    old_flags, alarms, judged = [], 0, 0
    for s in range(60):
        be = {"eager": 1e-3 * rng.uniform(0.5, 2), "fast": 1e-3 * rng.uniform(0.3, 1)}
        a, b = drifting_run(rng, be), drifting_run(rng, be)
        old_flags.append(compare_samples(a["fast"].samples, b["fast"].samples, n_boot=200, seed=s).p)
        for ch in compare_cells(cells(a, f"s{s}"), cells(b, f"s{s}"), floor_ratio=0.0):
            if ch.figure != "time":
                judged += 1
                alarms += ch.verdict.verdict in ("slower", "faster")
    assert sum(p < 0.01 for p in holm(old_flags)) >= 30  # what `compare` did: drift is "significant"
    assert judged == 60 and alarms <= 3  # 99 % intervals: about 0.6 expected


def test_a_ten_percent_slowdown_is_found_and_sized(rng):
    be = {"eager": 2e-3, "x": 1e-3}
    a = drifting_run(rng, be)
    b = drifting_run(rng, {"eager": 2e-3, "x": 1.1e-3})
    ch = {c.backend: c for c in compare_cells(cells(a, "s"), cells(b, "s"), floor_ratio=0.0)}
    v = ch["x"].verdict
    assert ch["x"].figure == "vs eager" and v.verdict == "slower"
    assert v.ci[0] < 0.10 < v.ci[1] and abs(v.change - 0.10) < 0.02
    assert ch["eager"].figure == "time"  # the baseline itself is judged on absolute time, drift and all


def test_the_noise_floor_widens_intervals_of_single_process_runs_only(rng):
    be = {"eager": 1e-3, "x": 1e-3}
    a, b = drifting_run(rng, be), drifting_run(rng, be)
    ea, eb = estimate(a["x"], a["eager"]), estimate(b["x"], b["eager"])
    narrow, wide = judge(ea, eb, noise_floor=0.0), judge(ea, eb, noise_floor=0.05)
    assert wide.ci[1] - wide.ci[0] > narrow.ci[1] - narrow.ci[0] + 0.15
    a2, b2 = drifting_run(rng, be, processes=3), drifting_run(rng, be, processes=3)
    e2a, e2b = estimate(a2["x"], a2["eager"]), estimate(b2["x"], b2["eager"])
    assert e2a.processes == 3 and judge(e2a, e2b, noise_floor=0.05).noise_floor == 0.0


def test_processes_that_disagree_widen_the_interval(rng):
    """A between-process offset (memory placement, thread pools) is invisible to one process's rounds."""
    run = drifting_run(rng, {"eager": 1e-3, "x": 1e-3}, processes=3, process_sd=0.1)
    e = estimate(run["x"], run["eager"])
    one = estimate(Timing(*(v[: len(v) // 3] for v in (run["x"].samples, run["x"].rounds, run["x"].processes))),
                   Timing(*(v[: len(v) // 3] for v in (run["eager"].samples, run["eager"].rounds,
                                                        run["eager"].processes))))
    assert e.processes == 3 and one.processes == 1
    assert e.se > 3 * one.se and e.df < 3  # the cell's own spread, with its two degrees of freedom


def test_paired_rounds_detect_a_five_percent_slowdown_under_drift(rng):
    """``nnforge ab``: both revisions in the same rounds; a 5 % slowdown is found and sized within ±2 %."""
    run = drifting_run(rng, {"A": 1e-3, "B": 1.05e-3}, drift=0.5)
    v = judge_paired(run["B"], run["A"])
    assert v.verdict == "slower" and abs(v.change - 0.05) < 0.02
    same = drifting_run(rng, {"A": 1e-3, "B": 1e-3}, drift=0.5)
    assert judge_paired(same["B"], same["A"]).verdict in ("no change", "inconclusive")


def test_batch_means_and_stored_rows():
    m, se, df = batch_means([1.0, 2.0, 3.0, 4.0])
    assert (m, df) == (2.5, 3.0) and se == pytest.approx(np.std([1, 2, 3, 4], ddof=1) / 2)
    assert batch_means([1.0])[1] == math.inf
    t = timing_from([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], {"round_samples": 2})
    assert t.rounds == (0, 0, 1, 1, 2, 2) and t.processes == (0,) * 6
    t = timing_from([1.0, 2.0, 3.0, 4.0], {"process_sample_counts": [2, 2], "sample_rounds": [0, 1, 0, 1]})
    assert t.rounds == (0, 1, 0, 1) and t.processes == (0, 0, 1, 1)
    t = timing_from([1.0, 2.0, 3.0], {"process_sample_counts": [2, 2], "sample_rounds": [0]})  # inconsistent
    assert t.processes == (0, 0, 0) and t.rounds == (0, 0, 0)
    v = judge_difference(math.log(1.2), 0.01, 20)
    assert v.regression(0.05) and not v.regression(0.25)


def test_pooling_the_spread_between_processes_over_cells(rng):
    """Two processes per run: one cell's own between-process spread has one degree of freedom (a 99 % interval 64
    standard errors wide); pooled over the run's cells the intervals narrow, and stay honest."""
    from nnforge.modelview.stats import pooled_between, with_between

    pairs = []
    for _ in range(30):
        be = {"eager": 1e-3 * rng.uniform(0.5, 2), "x": 1e-3 * rng.uniform(0.3, 1)}
        a = drifting_run(rng, be, processes=2, process_sd=0.02)
        b = drifting_run(rng, be, processes=2, process_sd=0.02)
        pairs.append((estimate(a["x"], a["eager"]), estimate(b["x"], b["eager"])))
    pa, pb = pooled_between([p[0] for p in pairs]), pooled_between([p[1] for p in pairs])
    assert pa[1] == 30 and 0.0002 < pa[0] < 0.003  # the ratio's between-process variance: about 2 × 0.02²
    own = [judge(ea, eb) for ea, eb in pairs]
    pooled = [judge(with_between(ea, *pa), with_between(eb, *pb)) for ea, eb in pairs]
    width = [np.median([v.ci[1] - v.ci[0] for v in vs]) for vs in (own, pooled)]
    assert width[1] < width[0] / 3
    assert sum(v.verdict in ("slower", "faster") for v in pooled) <= 2
    odd = dataclasses.replace(pairs[0][0], process_values=(0.0, 0.5))  # processes far apart: its own spread counts
    assert with_between(odd, *pa).se > 0.2
