"""A program's kernels compiled in parallel before its first launch, on a GPU.

Triton compiles a kernel when it is first launched, so a program's kernels compile one after another: for a 5-layer
LSTM stack (H = 96, float16) the three kernels took 5.3 s in sequence for sm_90 on the 2-core VM and 3.4 s on two
threads (docs/benchmarks.md). ``precompile`` runs the program once with a launcher that only asks each kernel to
compile (``warmup``, once per kernel: a host loop's step launches the same kernels every step) under Triton's
``AsyncCompileMode``, which hands the compiles to a thread pool, and waits for them all: the real run that follows
finds every kernel built (one launched with other argument properties than at its first launch, such as a
pointer's alignment, still compiles there). The same pool then builds the kernels' launchers, which Triton 3.6
builds with the C compiler at each kernel's first launch, in sequence (10 for a 5-layer LSTM training step, 0.11–0.15
s each on the 2-core VM). The pass runs the program's other device work (its
scratch allocations, copies into the outputs) on values the real run then overwrites. With a Triton that has no
``AsyncCompileMode`` it does nothing, and kernels compile at their first launch as before; a pass that fails is
logged and leaves them to compile there too.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

log = logging.getLogger("nnforge.codegen")


def precompile(run: Callable[..., None], ins: list, data: list, outs: list, sizes: Sequence[int], device: str,
               mode: Any = None, workers: int | None = None,
               launcher: Callable[[Any], object] | None = None) -> bool:
    """Compile every kernel ``run`` launches at these arguments, in parallel, then build their launchers on the
    same pool; whether it could (``mode``: Triton's ``AsyncCompileMode``, or a test's stand-in; ``launcher``:
    builds one compiled kernel's launcher, Triton's own by default)."""
    if mode is None:
        import triton

        mode = getattr(triton, "AsyncCompileMode", None)
        if mode is None:
            return False

    asked: set[int] = set()  # a host loop launches its kernels every step: each is asked once
    compiling: list[Any] = []

    def compile_only(kernel: Any, grid: tuple, *args: Any, **meta: Any) -> None:
        if all(g > 0 for g in grid) and id(kernel) not in asked:
            asked.add(id(kernel))
            compiling.append(kernel.warmup(*args, grid=grid, **meta))

    start = time.perf_counter()
    try:
        with ThreadPoolExecutor(workers or min(8, os.cpu_count() or 1)) as pool:
            with mode(pool):
                run(ins, data, outs, list(sizes), device, 0, launch=compile_only)
            compiled = time.perf_counter()
            done = [k.result() if hasattr(k, "result") else k for k in compiling if k is not None]
            built = build_launchers(done, pool, launcher or _triton_launcher)
    except Exception as e:  # the kernels then compile at launch, where a real error shows again
        log.warning("backend 'triton': compiling the kernels ahead in parallel failed (%s: %s); they compile at "
                    "their first launch", type(e).__name__, e)
        return False
    log.info("backend 'triton': %d kernels compiled ahead in %.3f s, %d launchers built in %.3f s", len(compiling),
             compiled - start, built, time.perf_counter() - compiled)
    return True


def build_launchers(kernels: Sequence[Any], pool: Executor, launcher: Callable[[Any], object]) -> int:
    """Build the launcher of each compiled kernel on ``pool``, once per signature (kernels alike in their
    parameters' types share one: a pointer is an address whatever it points to), and return how many were built.
    Some Tritons (3.6) build each launcher by running the C compiler at the kernel's first launch, one after
    another, and cache it on disk: built here, side by side, the first launches find them. One that fails is logged
    and left to that launch."""
    signatures = {}
    for k in kernels:
        types = getattr(getattr(k, "src", None), "signature", {}) or {}
        key = repr(([t[0] if t.startswith("*") else t for t in types.values()],
                    getattr(getattr(k, "metadata", None), "tensordesc_meta", None)))
        signatures.setdefault(key, k)

    def build(k: Any) -> bool:
        try:
            launcher(k)
        except Exception as e:
            log.info("backend 'triton': the launcher of %s was not built ahead (%s: %s); its first launch builds it",
                     getattr(k, "name", k), type(e).__name__, e)
            return False
        return True

    return sum(pool.map(build, signatures.values()))


def _triton_launcher(kernel: Any) -> object:
    """The launcher Triton makes for ``kernel`` at its first launch (the driver's ``launcher_cls``)."""
    import triton

    return triton.runtime.driver.active.launcher_cls(kernel.src, kernel.metadata)
