"""The timing loop, with a synthetic clock (no wall-clock assertions): warm-up, interleaving, adaptive stop,
errors isolated per backend, GC disabled while timing."""

from __future__ import annotations

import gc
import random
import zlib

import numpy as np
import pytest

from nnforge.modelview.spec import TimingConfig
from nnforge.modelview.timer import CpuClock, measure, measure_naive, warm_up


class FakeClock:
    """Returns a synthetic duration per sample: a per-callable base time with multiplicative noise, plus a warm-up
    transient for the first calls. Records the order in which callables were sampled."""

    name = "fake"

    def __init__(self, base: dict, noise: float, warm_calls: int = 0, seed: int | None = None) -> None:
        self.base, self.noise, self.warm_calls = base, noise, warm_calls
        self.rng = np.random.default_rng(seed)
        self.calls: dict[str, int] = dict.fromkeys(base, 0)
        self.order: list[str] = []
        self.gc_enabled_during_samples: set[bool] = set()

    def sample(self, call, inner: int) -> float:
        name = call()
        self.order.append(name)
        self.gc_enabled_during_samples.add(gc.isenabled())
        self.calls[name] += inner
        t = self.base[name] * (1 + self.noise * self.rng.standard_normal())
        if self.calls[name] <= self.warm_calls:
            t *= 5
        return max(t, 1e-12)

    def sync(self) -> None:
        pass


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A seed from the test's id, for the fake clock's noise and the timer's round orders: a failure replays."""
    return zlib.crc32(request.node.nodeid.encode())


def _fns(names):
    return {n: (lambda n=n: n) for n in names}


def test_interleaved_rounds_converge_to_the_target(seed):
    base = {"a": 1e-3, "b": 2e-3, "c": 5e-4}
    clock = FakeClock(base, noise=0.02, warm_calls=6, seed=seed)
    cfg = TimingConfig(target_rel_ci=0.01, budget_s=30, min_samples=10, round_samples=5, warmup_max_s=5,
                       min_sample_s=0)
    series = measure(_fns(base), cfg, clock, rng=random.Random(seed))
    for name, s in series.items():
        assert s.converged and s.steady and s.error is None
        med, lo, hi = s.summary(0.95)
        assert lo <= med <= hi and (hi - lo) / 2 <= 0.011 * med * 2
        assert med == pytest.approx(base[name], rel=0.03)  # the 5x warm-up transient is excluded
    assert clock.gc_enabled_during_samples == {False}
    assert gc.isenabled()
    # interleaving: after warm-up, rounds visit the backends in changing orders, and no backend runs all its
    # samples in one block
    timed = clock.order[sum(s.warmup_calls for s in series.values()):]
    blocks = [timed[i] for i in range(0, len(timed), 5)]
    assert len(set(blocks[:3])) == 3
    orders = {tuple(blocks[i : i + 3]) for i in range(0, min(len(blocks), 60) - 2, 3)}
    assert len(orders) > 1


def test_budget_stops_a_backend_that_cannot_converge(seed):
    base = {"noisy": 1e-3, "quiet": 1e-3}
    clock_noise = {"noisy": 0.8, "quiet": 0.0}

    class MixedClock(FakeClock):
        def sample(self, call, inner):
            name = call()
            self.noise = clock_noise[name]
            return super().sample(lambda: name, inner)

    mixed = MixedClock(base, 0.0, seed=seed)
    cfg = TimingConfig(target_rel_ci=0.001, budget_s=0.05, min_samples=5, round_samples=5, warmup_max_s=0.01,
                       min_sample_s=0)
    series = measure(_fns(base), cfg, mixed, rng=random.Random(seed))
    assert series["quiet"].converged
    assert not series["noisy"].converged and series["noisy"].stop_reason in ("time budget exhausted",
                                                                             "max_samples reached")


def test_a_raising_callable_is_reported_and_the_others_go_on(seed):
    state = {"n": 0}

    def flaky():
        state["n"] += 1
        if state["n"] > 7:  # after warm-up, during the timed rounds
            raise RuntimeError("boom")
        return "flaky"

    clock = FakeClock({"ok": 1e-3, "flaky": 1e-3}, noise=0.01, seed=seed)
    cfg = TimingConfig(target_rel_ci=0.01, budget_s=5, min_samples=10, warmup_max_s=1, min_sample_s=0)
    series = measure({"ok": lambda: "ok", "flaky": flaky}, cfg, clock, rng=random.Random(seed))
    assert series["flaky"].error == "RuntimeError: boom"
    assert series["ok"].error is None and series["ok"].converged


def test_short_calls_are_batched_into_samples():
    clock = FakeClock({"tiny": 1e-6}, noise=0.0)
    cfg = TimingConfig(min_sample_s=1e-3, budget_s=1, min_samples=5, warmup_max_s=0.1)
    series = measure({"tiny": lambda: "tiny"}, cfg, clock)
    assert series["tiny"].inner in (1000, 1001)  # ceil(1e-3 / 1e-6) up to float rounding


def test_real_clock_warm_up_and_naive_loop():
    cfg = TimingConfig(warmup_max_s=0.05, budget_s=0.02)
    calls, spent, steady, est = warm_up(lambda: sum(range(100)), CpuClock(), cfg)
    assert calls >= 3 and spent >= 0 and est > 0 and isinstance(steady, bool)
    s = measure_naive(lambda: sum(range(100)), cfg)
    assert len(s.samples) == 1 and s.samples[0] > 0 and s.inner >= 1
