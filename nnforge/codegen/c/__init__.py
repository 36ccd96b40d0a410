"""The CPU backend: scheduled IR -> C (OpenMP, vectorizable loops) -> shared object cached on disk -> ctypes.

``CpuBackend`` is an explicit object holding the compiler and the loaded libraries; ``nnforge.codegen`` keeps
one in its backend table. Graphs the C generator does not cover (side effects, half precision) run on the
reference interpreter instead, with a WARNING giving the reason once per reason: a user who
asked for compiled code is told it is interpreted.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ...ir.lengths import loop_length_symbols
from ...ir.node import Graph
from ...passes import pipeline, run_pipeline
from ...schedule import Random, schedule
from .cexpr import Sizes, Unsupported
from .gemm import GemmConfig
from .lower import KernelInfo, Lowering
from .program import CProgram
from .target import cpu_target
from .toolchain import Toolchain, find_compiler, missing_compiler_reason, works

log = logging.getLogger("nnforge.codegen.c")


def prepare(graph: Graph, gemm: GemmConfig | None = None) -> Graph:
    """The compiled-code passes (hoisting, premul, layout) with the CPU's thresholds for these GEMM tiles, applied
    to an already optimized graph."""
    return run_pipeline(graph, pipeline(cpu_target(gemm)))


def lower(graph: Graph, gemm: GemmConfig | None = None) -> Lowering:
    """The scheduled program of ``graph`` (after ``prepare`` with the same ``gemm``) rendered as C: source, kernel
    listing and the ``Program`` it renders (``.program``); raises Unsupported."""
    program = schedule(graph, cpu_target(gemm))
    sizes = Sizes(sorted(loop_length_symbols(graph)), seeded=any(isinstance(k, Random) for k in program.kernels()))
    low = Lowering(program, sizes, gemm)
    low.text = low.source()
    return low


@dataclass
class CpuBackend:
    """Builds programs; owns the toolchain (compiler + in-memory library cache)."""

    gemm: GemmConfig = field(default_factory=GemmConfig)
    _toolchain: Toolchain | None = None
    _warned: set[str] = field(default_factory=set)  # fallback reasons already reported

    @functools.cached_property
    def available(self) -> bool:
        return works(find_compiler())

    @property
    def toolchain(self) -> Toolchain:
        if self._toolchain is None:
            if not self.available:
                raise RuntimeError(missing_compiler_reason())
            self._toolchain = Toolchain(find_compiler())
        return self._toolchain

    def __call__(self, graph: Graph) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
        from ...runtime import debug_level, setup_logging

        setup_logging()
        gemm = self._gemm_for(graph)
        graph = prepare(graph, gemm)
        try:
            low = lower(graph, gemm)
        except Unsupported as e:
            from ..reference import ReferenceProgram

            if str(e) not in self._warned:
                self._warned.add(str(e))
                log.warning("backend 'cpu': %s; this graph runs on the reference interpreter (numpy), not as "
                            "compiled code", e)
            return ReferenceProgram(graph)
        if debug_level() >= 3:
            log.debug("generated C:\n%s", low.text)
        lib, key = self.toolchain.load(low.text)
        return CProgram(graph, lib, key, low.sizes, [n.attrs["array"] for n in low.data], low.listing, low.text)

    def scheduled(self, graph: Graph) -> str:
        """``nf.show(stage="scheduled")``: the program the CPU target schedules (``scheduled``)."""
        return scheduled(graph)

    def source(self, graph: Graph) -> str:
        """``nf.show(stage="source")``: the C this backend would compile for an optimized graph, with the tiles
        ``nf.show`` shows (raises ``Unsupported`` where it would run the interpreter instead)."""
        gemm = _shown_config()
        return lower(prepare(graph, gemm), gemm).text

    def _gemm_for(self, graph: Graph) -> GemmConfig:
        """The tile configuration to build with: a tuned one from the cache, else this backend's; its vector width
        the compiler's widest where it says 0."""
        from ...tune import load_gemm_config

        return self.resolve(load_gemm_config() or self.gemm)

    def resolve(self, cfg: GemmConfig) -> GemmConfig:
        """``cfg`` with its vector width decided: the compiler's widest where it says 0."""
        return cfg if cfg.vector_bytes else replace(cfg, vector_bytes=self.toolchain.vector_bytes)


def _shown_config() -> GemmConfig:
    """The tiles ``nf.show`` shows: those the registered ``cpu`` backend builds with (its vector width is the C
    compiler's), the AVX2 ones where it has no compiler."""
    from .. import BACKENDS

    be = BACKENDS.get("cpu")
    if isinstance(be, CpuBackend) and be.available:
        return be.resolve(be.gemm)
    return GemmConfig(vector_bytes=32)


def fused_listing(graph: Graph) -> str:
    """``nf.show(stage="fused")``: the scheduled IR and its kernels, for an optimized graph."""
    gemm = _shown_config()
    return format_listing(lower(prepare(graph, gemm), gemm).listing)


def scheduled(graph: Graph) -> str:
    """``nf.show(stage="scheduled")``: the backend-neutral program the CPU target schedules for an optimized
    graph (the C backend renders exactly this)."""
    gemm = _shown_config()
    return str(schedule(prepare(graph, gemm), cpu_target(gemm)))


def format_listing(kernels: list[KernelInfo], indent: str = "") -> str:
    """The kernel listing, one block per kernel, loops nested (the seed's procedural IR)."""
    lines = []
    for k, info in enumerate(kernels):
        if info.kind in ("scan", "loop"):
            lines.append(f"{indent}{info.kind} -> ({info.out}) {info.note} {{")
            lines.append(format_listing(info.children, indent + "    "))
            lines.append(f"{indent}}}")
            continue
        head = f"{indent}kernel {k} {info.kind} -> {info.out} {info.type}"
        if info.fused:
            head += f" fuses [{', '.join(info.fused)}]"
        if info.note:
            head += f" ({info.note})"
        lines.append(head)
        for s in info.stores:
            lines.append(f"{indent}    {s}")
        for ld in dict.fromkeys(info.loads):
            lines.append(f"{indent}    reads {ld}")
    return "\n".join(lines)
