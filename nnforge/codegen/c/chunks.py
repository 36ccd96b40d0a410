"""Time-chunked input projections: the hoisted ``x @ W_ih + b`` of a row-split scan computed a chunk of steps at a
time inside the loop, instead of for all T steps before it.

Why: hoisting makes the input projection one big efficient GEMM, but for long sequences its result ([T, N, 4H]:
196 MB at T = 2000, N = 64, H = 96) goes through DRAM twice, written by the GEMM and read back step by step, and it
is the largest buffer of an inference call. Computed for C steps at a time (a work-shared GEMM with M = C * N rows,
between two barriers, every C steps), the chunk stays in L2/L3 for the steps that read it, and the buffer shrinks
to C * N * 4H. Only where the loop is split by rows (its other steps need no barrier) and the projection has no
other reader (a training step also reads it in the backward pass, so there it stays whole).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...ir.dims import symbol_name
from ...ir.node import Graph, Node, users
from ...ir.ops import Op
from ...passes.fuse import Grouping
from ...schedule import Target
from .cexpr import Sizes

if TYPE_CHECKING:
    from .lower import GraphCtx, Lowering


@dataclass(frozen=True)
class Deferred:
    """A top-level GEMM kernel (``p``, with the elementwise ``root`` as its epilogue) whose only reader is the
    ``k``-th scanned input of ``scan`` (through the reshape ``view``)."""

    root: Node
    p: Node
    scan: Node
    k: int
    view: Node


def find_deferred(low: Lowering, graph: Graph, g: Grouping) -> dict[int, Deferred]:
    """The input projections of row-split scans of ``graph`` that can be computed chunk by chunk, by id(root)."""
    us = users(graph.order)
    outs = {id(o) for o in graph.outputs}
    found: dict[int, Deferred] = {}
    for n in graph.order:
        if n.op != Op.SCAN or low.split_of(n) is None:
            continue
        nc, nx = n.attrs["n_carry"], n.attrs["n_xs"]
        for k in range(nx):
            view = n.srcs[nc + k]
            if view.op != Op.RESHAPE or id(view) not in g.alias or view.ndim != 3:
                continue
            root = view.srcs[0]
            p = root if root.op == Op.MATMUL else next((m for m in graph.order if id(m) == g.prologue.get(id(root))),
                                                       None)
            if p is None or p.op != Op.MATMUL or p.ndim != 2 or not g.is_stored(root):
                continue
            if [u for u in us.get(id(root), [])] != [view] or [u for u in us.get(id(view), [])] != [n]:
                continue
            if symbol_name(view.shape[0]) is None:  # a length derived from others (a strided conv's output):
                continue                            # the chunk's GEMM could not be given its step count
            if id(root) in outs or id(view) in outs or sum(s is view for s in n.srcs) != 1:
                continue
            if int(p.shape[0]) != int(view.shape[0]) * int(view.shape[1]):
                continue
            found[id(root)] = Deferred(root, p, n, k, view)
    return found


def chunk_steps(d: Deferred, target: Target) -> int:
    """Steps per chunk: as many as fit ``target.chunk_bytes`` (at least one, at most ``target.max_chunk_steps``)."""
    per_step = int(d.view.shape[1]) * int(d.view.shape[2]) * d.view.dtype.itemsize
    return max(1, min(target.max_chunk_steps, target.chunk_bytes // max(per_step, 1)))


def emit_chunk(low: Lowering, d: Deferred, ctx: GraphCtx, chunk: str, t: str, length: str, rev: bool,
               steps: int, lo: str, count: str, ind: str, before: list[str]) -> list[str]:
    """Every ``steps`` time steps: the projection of the next chunk (steps ``lo .. lo + count`` of the sequence,
    in the scan's direction) into ``chunk``, work-shared among the threads between two barriers. The weights are
    packed once, by code added to ``before`` (what runs before the time loop)."""
    from .gemm import emit_gemm, pack_panels

    sz = low.sizes
    batch = sz(d.view.shape[1])
    views = low.operand_views(d.p, ctx)
    (pa, oa, sa), vb = views
    a_view = (pa, f"({oa}) + {lo} * ({batch}) * ({sa[-2]})", sa)
    length_dim = d.view.shape[0]
    lines = [f"{ind}if ({t} % {steps} == 0) {{",
             f"{ind}    {count} = {length} - {t} < {steps} ? {length} - {t} : {steps};",
             f"{ind}    {lo} = {f'{length} - {t} - {count}' if rev else t};",
             f"{ind}    #pragma omp barrier"]
    ep_info: list = []
    epilogue = low.gemm_epilogue(d.p, d.root if d.root is not d.p else None, ctx, ep_info)

    def global_rows(idx: list[str], acc: str, lanes: int, lane: str) -> tuple[list[str], list[str], str]:
        """The epilogue reads its other operands (a bias) at the row of the whole sequence."""
        return epilogue([f"({idx[0]} + {lo} * ({batch}))", *idx[1:]], acc, lanes, lane)

    columns = [("0", sz(d.p.shape[-1]))]
    buf, _ = low.packed_b(d.p, vb, columns, lines, ind)
    before += pack_panels(low, d.p.dtype, sz(d.p.srcs[0].shape[-1]), (f"({vb[0]} + ({vb[1]}))", vb[2][-2], vb[2][-1]),
                          columns, buf, "", shared=True)
    outer = low.sizes
    low.sizes = _with_steps(outer, length_dim, count)
    try:
        text, _ = emit_gemm(low, d.p, [a_view, vb], chunk, buf, buf,
                            global_rows if epilogue else None, ind + "    ",
                            d.root is d.p or d.root.dtype == d.p.dtype)
    finally:
        low.sizes = outer
    lines += text
    lines.append(f"{ind}}}")
    return lines


def _with_steps(sz: Sizes, length_dim: int, count: str) -> Sizes:
    """Sizes in which the scan's length symbol is this chunk's step count (so the GEMM has count * N rows)."""
    name = symbol_name(length_dim)
    if name is None:
        raise ValueError("a chunked projection needs a symbolic sequence length")
    return sz.with_local(name, count)
