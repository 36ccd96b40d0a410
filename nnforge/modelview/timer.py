"""Timing with less noise.

The method (docs/modelview.md explains each choice):

1. **Warm-up until steady**: windows of calls until two successive windows' medians agree within a tolerance (JIT
   profiling executors, autotuners and allocators settle in the first calls), bounded by a time limit.
2. **Batching of very short calls** into one sample so the clock's resolution and overhead do not dominate.
3. **Interleaved rounds**: each round visits every unfinished backend of the setting in a fresh random order and takes
   a few samples of each. Slow drifts of the machine (frequency, a noisy neighbour, thermal state) then hit all
   backends alike instead of whichever happened to be measured during the drift.
4. **Adaptive repeats**: a backend is done once its median's confidence interval is within ±target; everything stops
   at the time budget (and the result says whether the target was met).
5. **Device synchronisation** around every sample (CUDA events on GPUs), **GC disabled** while timing, an optional
   **cache flush** before each sample and **input rotation** across calls.
"""

from __future__ import annotations

import gc
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .spec import TimingConfig
from .stats import median_ci, rel_halfwidth


class CpuClock:
    """Wall time (perf_counter) around ``inner`` calls, and the process's CPU time (all threads) alongside as
    ``secondary``. ``sync`` is a no-op on CPU (every op has finished when it returns).

    With ``primary="cpu"`` the roles swap: the process CPU time becomes the measurement. On a shared machine that is
    the reproducible figure — it excludes the time the process waited for a core — but with several threads it sums
    them (spin-waits included), so it is a cost, not a latency."""

    def __init__(self, primary: str = "wall") -> None:
        if primary not in ("wall", "cpu"):
            raise ValueError(primary)
        self.primary = primary
        self.name = "perf_counter" if primary == "wall" else "process_cpu_time"
        self.secondary: float | None = None

    def sample(self, call: Callable[[], Any], inner: int) -> float:
        c0 = time.process_time_ns()
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            call()
        wall = (time.perf_counter_ns() - t0) / 1e9 / inner
        cpu = (time.process_time_ns() - c0) / 1e9 / inner
        if self.primary == "wall":
            self.secondary = cpu
            return wall
        self.secondary = wall
        return cpu

    def sync(self) -> None:
        pass


class CudaEventClock:
    """CUDA events recorded on the current stream around ``inner`` calls: device time, without host jitter."""

    name = "cuda_events"
    secondary = None

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def sample(self, call: Callable[[], Any], inner: int) -> float:
        self._torch.cuda.synchronize()
        self._start.record()
        for _ in range(inner):
            call()
        self._end.record()
        self._end.synchronize()
        return self._start.elapsed_time(self._end) / 1000.0 / inner

    def sync(self) -> None:
        self._torch.cuda.synchronize()


@dataclass
class Series:
    """Timing of one backend. ``samples`` are seconds per call (each the mean of ``inner`` calls)."""

    samples: list[float] = field(default_factory=list)
    secondary: list[float] = field(default_factory=list)  # the clock's other measure (CPU time when timing wall)
    rounds: list[int] = field(default_factory=list)  # the interleaved round each sample was taken in
    inner: int = 1
    warmup_calls: int = 0
    warmup_s: float = 0.0
    steady: bool = False
    converged: bool = False
    done: bool = False
    error: str | None = None
    stop_reason: str = ""

    def summary(self, confidence: float) -> tuple[float, float, float]:
        return median_ci(self.samples, confidence)


def warm_up(call: Callable[[], Any], clock: Any, cfg: TimingConfig) -> tuple[int, float, bool, float]:
    """Run ``call`` until steady. Returns (calls made, seconds spent, steady?, estimated seconds per call)."""
    window = max(3, cfg.warmup_min_calls)
    t_start = time.perf_counter()
    calls = 0
    prev: float | None = None
    est = float("inf")
    while True:
        times = [clock.sample(call, 1) for _ in range(window)]
        calls += window
        cur = float(np.median(times))
        est = cur
        elapsed = time.perf_counter() - t_start
        if prev is not None and abs(cur - prev) <= cfg.warmup_tolerance * prev:
            return calls, elapsed, True, est
        if elapsed >= cfg.warmup_max_s:
            return calls, elapsed, False, est
        prev = cur


def measure(
    calls: Mapping[str, Callable[[], Any]],
    cfg: TimingConfig,
    clock: Any | None = None,
    flush: Callable[[], None] | None = None,
    on_round: Callable[[int, Mapping[str, Series]], None] | None = None,
    rng: random.Random | None = None,
) -> dict[str, Series]:
    """Time every callable of one setting in interleaved rounds (see module doc). A callable that raises is marked with
    its error and leaves the rotation; the others go on."""
    clock = clock or CpuClock()
    rng = rng or random.Random()
    series = {name: Series() for name in calls}
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for name, call in calls.items():
            s = series[name]
            try:
                s.warmup_calls, s.warmup_s, s.steady, est = warm_up(call, clock, cfg)
            except Exception as e:
                s.error, s.done, s.stop_reason = f"{type(e).__name__}: {e}", True, "error during warm-up"
                continue
            if cfg.flush_cache or est <= 0:
                s.inner = 1
            else:
                s.inner = max(1, math.ceil(cfg.min_sample_s / est))
        budget = cfg.budget_s * max(1, len(calls))
        t_start = time.perf_counter()
        rounds = 0
        while True:
            active = [n for n, s in series.items() if not s.done]
            if not active:
                break
            rng.shuffle(active)
            for name in active:
                s = series[name]
                try:
                    for _ in range(cfg.round_samples):
                        if flush is not None:
                            flush()
                        s.samples.append(clock.sample(calls[name], s.inner))
                        s.rounds.append(rounds)
                        if getattr(clock, "secondary", None) is not None:
                            s.secondary.append(clock.secondary)
                except Exception as e:
                    s.error, s.done, s.stop_reason = f"{type(e).__name__}: {e}", True, "error while timing"
                    continue
                n = len(s.samples)
                if n >= cfg.min_samples:
                    med, lo, hi = median_ci(s.samples, cfg.confidence)
                    if rel_halfwidth(med, lo, hi) <= cfg.target_rel_ci:
                        s.converged, s.done, s.stop_reason = True, True, "confidence target reached"
                    elif n >= cfg.max_samples:
                        s.done, s.stop_reason = True, "max_samples reached"
            rounds += 1
            if on_round is not None:
                on_round(rounds, series)
            if time.perf_counter() - t_start >= budget:
                for s in series.values():
                    if not s.done:
                        s.done, s.stop_reason = True, "time budget exhausted"
        return series
    finally:
        if gc_was_enabled:
            gc.enable()


def measure_naive(call: Callable[[], Any], cfg: TimingConfig, clock: Any | None = None) -> Series:
    """The usual hand-rolled benchmark, kept for comparison (bench/modelview_noise.py): three warm-up calls, then one
    loop for the time budget, reporting the mean; no steadiness check, no interleaving, GC left on."""
    clock = clock or CpuClock()
    for _ in range(3):
        call()
    clock.sync()
    t0 = time.perf_counter()
    n = 0
    while True:
        call()
        n += 1
        clock.sync()
        if time.perf_counter() - t0 >= cfg.budget_s:
            break
    mean = (time.perf_counter() - t0) / n
    return Series(samples=[mean], inner=n, warmup_calls=3, steady=False, converged=False, done=True,
                  stop_reason="naive single loop")
