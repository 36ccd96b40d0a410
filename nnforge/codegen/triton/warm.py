"""A program's kernels compiled in parallel before its first launch, on a GPU.

Triton compiles a kernel when it is first launched, so a program's kernels compile one after another: for a 5-layer
LSTM stack (H = 96, float16) the three kernels took 5.3 s in sequence for sm_90 on the 2-core VM and 3.4 s on two
threads (docs/benchmarks.md). ``precompile`` runs the program once with a launcher that only asks each kernel to
compile (``warmup``, once per kernel: a host loop's step launches the same kernels every step) under Triton's
``AsyncCompileMode``, which hands the compiles to a thread pool, and waits for them all: the real run that follows
finds every kernel built (one launched with other argument properties than at its first launch, such as a
pointer's alignment, still compiles there). The pass runs the program's other device work (its
scratch allocations, copies into the outputs) on values the real run then overwrites. With a Triton that has no
``AsyncCompileMode`` it does nothing, and kernels compile at their first launch as before; a pass that fails is
logged and leaves them to compile there too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger("nnforge.codegen")


def precompile(run: Callable[..., None], ins: list, data: list, outs: list, sizes: Sequence[int], device: str,
               mode: Any = None, workers: int | None = None) -> bool:
    """Compile every kernel ``run`` launches at these arguments, in parallel; whether it could (``mode``: Triton's
    ``AsyncCompileMode``, or a test's stand-in)."""
    if mode is None:
        import triton

        mode = getattr(triton, "AsyncCompileMode", None)
        if mode is None:
            return False

    asked: set[int] = set()  # a host loop launches its kernels every step: each is asked once

    def compile_only(kernel: Any, grid: tuple, *args: Any, **meta: Any) -> None:
        if all(g > 0 for g in grid) and id(kernel) not in asked:
            asked.add(id(kernel))
            kernel.warmup(*args, grid=grid, **meta)

    try:
        with ThreadPoolExecutor(workers or min(8, os.cpu_count() or 1)) as pool, mode(pool):
            run(ins, data, outs, list(sizes), device, 0, launch=compile_only)
    except Exception as e:  # the kernels then compile at launch, where a real error shows again
        log.warning("backend 'triton': compiling the kernels ahead in parallel failed (%s: %s); they compile at "
                    "their first launch", type(e).__name__, e)
        return False
    return True
