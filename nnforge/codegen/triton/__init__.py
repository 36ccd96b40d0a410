"""The Triton renderer (first slice of the GPU backend): scheduled IR -> Triton kernels + a launcher.

``TritonBackend()(graph)`` prepares an optimized graph with the GPU target's passes, schedules it
(``schedule(graph, triton_target())``), renders the ``Program`` as one Python module of ``@triton.jit`` kernels
(``render.py``, persistent scan kernels in ``scan.py``), imports it from a file named by its source hash and
returns a callable program. It runs under ``TRITON_INTERPRET=1`` on CPU tensors (set before triton is imported)
or on a CUDA device.

Not yet a backend of ``nnforge.codegen.BACKENDS``: it becomes one when the whole test matrix runs on it. What this
slice does not render raises ``nnforge.schedule.Unsupported`` with the reason.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import ClassVar

import numpy as np

from ...ir.lengths import loop_length_symbols
from ...ir.node import Graph
from ...ir.ops import Op
from ...passes import pipeline, run_pipeline
from ...schedule import Program, Target, Unsupported, schedule
from .program import TritonProgram, load_module, source_key
from .render import Rendered, Renderer
from .target import Tiles, triton_target
from .texpr import Sizes

log = logging.getLogger("nnforge.codegen.triton")

__all__ = ["Rendered", "Tiles", "TritonBackend", "TritonProgram", "Unsupported", "lower", "prepare",
           "triton_target"]


def prepare(graph: Graph, target: Target | None = None) -> Graph:
    """The compiled-code passes with the GPU target's thresholds, applied to an already optimized graph."""
    return run_pipeline(graph, pipeline(target or triton_target()))


def lower(graph: Graph, tiles: Tiles | None = None, target: Target | None = None) -> tuple[Program, Rendered]:
    """The program scheduled for the GPU target (of a graph after ``prepare`` with the same target) and its
    Triton module source; raises ``Unsupported``."""
    program = schedule(graph, target or triton_target())
    return program, render(program, graph, tiles)


def render(program: Program, graph: Graph, tiles: Tiles | None = None) -> Rendered:
    """The Triton module of a scheduled program; raises ``Unsupported`` for what the renderer cannot spell."""
    return Renderer(program, Sizes(sorted(loop_length_symbols(graph))), tiles).render()


def cuda_graphs_on(choice: bool | None) -> bool | None:
    """Whether programs replay as CUDA graphs (``graphs.py``): the caller's choice, else ``NNFORGE_CUDA_GRAPHS``
    (``1`` on, ``0`` off), else None: the program decides (``graphs.captured_by_default``)."""
    if choice is not None:
        return choice
    env = os.environ.get("NNFORGE_CUDA_GRAPHS", "")
    return None if env == "" else env != "0"


def interpreted() -> bool:
    """Kernels run on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


@dataclass
class TritonBackend:
    """Builds Triton programs; owns the imported modules (by source hash: an identical program, such as the
    same function traced at another sequence length, reuses the loaded module and its compiled kernels).
    ``loads`` counts modules imported (the compiles this backend caused). ``target``: the thresholds handed to the
    passes and the scheduler (``triton_target()``; tests pass others to reach other schedules)."""

    # what ``nf.compile(..., options=...)`` may set
    OPTIONS: ClassVar[tuple[str, ...]] = ("cuda_graphs", "tiles", "target")
    tiles: Tiles | None = None  # None: tuned tiles cached for this GPU (``nnforge.tune.tune_triton``), else defaults
    cuda_graphs: bool | None = None  # programs replayed as CUDA graphs (graphs.py); None: NNFORGE_CUDA_GRAPHS, else
    # those with a host loop
    target: Target = field(default_factory=triton_target)
    _modules: dict[str, ModuleType] = field(default_factory=dict)
    _warned: set[str] = field(default_factory=set)  # fallback reasons already reported
    loads: int = 0

    @functools.cached_property
    def available(self) -> bool:
        """Triton imports and kernels can run: under the interpreter, or with a CUDA device."""
        try:
            import torch
            import triton  # only whether it imports
        except ImportError:
            return False
        return interpreted() or bool(torch.cuda.is_available())

    @functools.cached_property
    def device_tiles(self) -> Tiles:
        """Tiles ``tune_triton`` cached for this GPU (by its name); the defaults on the interpreter or untuned."""
        if interpreted():
            return Tiles()
        import torch

        from ...tune.triton import load_triton_tiles

        tuned = load_triton_tiles(torch.cuda.get_device_name())
        if tuned is not None:
            log.info("backend 'triton': tiles tuned for %s: %s", torch.cuda.get_device_name(), tuned)
        return tuned or Tiles()

    @property
    def device(self) -> str:
        return "cpu" if interpreted() else "cuda"

    def scheduled(self, graph: Graph) -> str:
        """``nf.show(stage="scheduled")`` of a function compiled for Triton: the program this backend's target
        schedules for an optimized graph (whole-row kernels, weight gradients summed in parts, persistent scans),
        which it renders."""
        return str(schedule(prepare(graph, self.target), self.target))

    def source(self, graph: Graph) -> str:
        """``nf.show(stage="source")``: the Triton module this backend would build for an optimized graph, with
        the tiles it would build with (raises ``Unsupported`` where it would run the interpreter instead)."""
        graph = prepare(graph, self.target)
        tiles = self.tiles or (self.device_tiles if self.available else Tiles())
        return render(schedule(graph, self.target), graph, tiles).source

    def __call__(self, graph: Graph) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
        from ...runtime import debug_level, setup_logging

        setup_logging()
        if not self.available:
            raise Unsupported("Triton needs a CUDA device or TRITON_INTERPRET=1")
        graph = prepare(graph, self.target)
        try:
            loops = [n for n in graph.order if n.op == Op.LOOP]
            if loops:  # an nf.loop the compiled-code passes freed of its effect root (passes.dce.pure_loops)
                raise Unsupported(f"nf.loop at {loops[0].loc} is not rendered by the Triton backend")
            program = schedule(graph, self.target)
        except Unsupported as e:  # the shared policy: what no kernel can run (effects) runs on the interpreter
            from ..reference import ReferenceProgram

            if str(e) not in self._warned:
                self._warned.add(str(e))
                log.warning("backend 'triton': %s; this graph runs on the reference interpreter (numpy), not as "
                            "Triton kernels", e)
            return ReferenceProgram(graph)
        rendered = render(program, graph, self.tiles or self.device_tiles)
        if debug_level() >= 3:
            log.debug("generated Triton:\n%s", rendered.source)
        key = source_key(rendered.source)
        if key not in self._modules:
            self._modules[key] = load_module(rendered.source)
            self.loads += 1
        data = [n.attrs["array"] for n in graph.order if n.op.name == "DATA"]
        return TritonProgram(graph, self._modules[key], rendered.source, rendered.kernels,
                             sorted(loop_length_symbols(graph)), data, self.device,
                             cuda_graphs=cuda_graphs_on(self.cuda_graphs))
