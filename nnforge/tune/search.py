"""The search itself: time GEMM programs built with each candidate config, keep the fastest."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..codegen.c.gemm import GemmConfig
from ..codegen.c.toolchain import cache_dir

log = logging.getLogger("nnforge.tune")


def _path() -> Path:
    return cache_dir().parent / "tune" / "gemm.json"


def load_gemm_config() -> GemmConfig | None:
    """The tuned config, or None when no (valid) tuning result is cached."""
    try:
        data = json.loads(_path().read_text())
        return GemmConfig(**data["config"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _time_config(cfg: GemmConfig, shapes: Sequence[tuple[int, int, int]], repeats: int) -> float:
    from .. import compile as nf_compile
    from ..codegen.c import CpuBackend

    backend = CpuBackend(gemm=cfg)
    total = 0.0
    rng = np.random.default_rng(0)
    for m, k, n in shapes:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        fn = nf_compile(lambda x, y: x @ y, backend="reference")
        graph = fn.trace(a, b)
        backend._gemm_for = lambda _g, c=cfg: c  # time this candidate, not a cached tuning result
        program = backend(graph)
        program([a, b])
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            program([a, b])
            best = min(best, time.perf_counter() - t0)
        total += best
    return total


def tune_gemm(shapes: Sequence[tuple[int, int, int]] = ((4096, 384, 1536), (64, 384, 1536), (8192, 96, 384)),
              candidates: Sequence[int] = (64, 128, 256, 512, 1024), repeats: int = 5) -> GemmConfig:
    """Time each NC candidate on ``shapes`` (M, K, N), cache and return the best config."""
    results = {}
    for nc in candidates:
        cfg = GemmConfig(nc=nc)
        results[nc] = _time_config(cfg, shapes, repeats)
        log.info("nc=%d: %.3f ms", nc, results[nc] * 1e3)
    best = GemmConfig(nc=min(results, key=results.get))
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"config": asdict(best), "timings_s": {str(k): v for k, v in results.items()}}))
    tmp.replace(path)
    return best
