"""The search itself: time GEMM programs built with each candidate config, keep the fastest."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..codegen.c.gemm import GemmConfig
from ..codegen.c.toolchain import cache_dir
from .coordinate import coordinate_search, load_result, save_result


def _path() -> Path:
    return cache_dir().parent / "tune" / "gemm.json"


def load_gemm_config() -> GemmConfig | None:
    """The tuned config, or None when no (valid) tuning result is cached."""
    return load_result(_path(), "config", GemmConfig)


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
        backend._gemm_for = lambda _g, c=cfg: backend.resolve(c)  # this candidate, not a cached tuning result
        program = backend(graph)
        program([a, b])
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            program([a, b])
            best = min(best, time.perf_counter() - t0)
        total += best
    return total


AXES: dict[str, tuple] = {
    "nc": (64, 128, 256),          # columns per work item (B panels kept in L1 across its row blocks)
    "mc": (48, 96, 192),           # rows per work item
    "pack_a": (False, True),       # large-M GEMM: pack A per thread in MCA x KC blocks
    "kc": (192, 256, 512),         # K slice when A is packed (B panel slice KC x NR in L1)
    "mca": (96, 144, 288),         # rows per packed A block (L2)
    "nca": (64, 192, 384),         # columns per packed-A work item (A is packed once per item)
}


def tune_gemm(shapes: Sequence[tuple[int, int, int]] = ((6400, 512, 2048), (64, 384, 1536), (25600, 96, 384)),
              axes: dict[str, Sequence] | None = None, repeats: int = 5) -> GemmConfig:
    """Coordinate search over ``axes`` (one axis at a time, keeping the best value found so far) timed on
    ``shapes`` (M, K, N); caches and returns the best config. A few dozen builds instead of the full product:
    the axes interact little (row vs column blocking, then the packed-A path's own two sizes)."""
    best, results = coordinate_search(GemmConfig(), axes or AXES, lambda cfg: _time_config(cfg, shapes, repeats),
                                      skip=lambda best, axis: axis in ("kc", "mca", "nca") and not best.pack_a)
    save_result(_path(), {"config": asdict(best), "timings_s": results})
    return best
