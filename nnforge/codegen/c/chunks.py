"""The C form of a time-chunked input projection (``schedule.ChunkedInput``; the scheduler decides which and how
many steps): every ``steps`` steps of the row-split loop, each thread computes its own rows of the next chunk
(a GEMM of its rows per step) into the chunk buffer, with the weights packed once before the loop. No barrier:
a thread reads and writes only its rows of the chunk, and the rows stay in its own core's cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...ir.dims import Dim, symbol_name
from ...ir.expr import Expr, var
from ...schedule import ChunkedInput, stored_node
from .cexpr import Sizes
from .emit import Emitter
from .gemm import emit_gemm, pack_panels

if TYPE_CHECKING:
    from .lower import GraphCtx, Lowering
    from .rowsched import RowScope


def emit_chunk(low: Lowering, em: Emitter, c: ChunkedInput, ctx: GraphCtx, chunk: str, t: str, length: str,
               rev: bool, lo: str, count: str, before: Emitter, rows: RowScope) -> None:
    """Every ``steps`` time steps: the projection of the next chunk (steps ``lo .. lo + count`` of the sequence,
    in the scan's direction) into ``chunk``, this thread's ``rows`` of each step. The weights are packed once, by
    code added to ``before`` (what runs before the time loop).

    Measured against the chunk as one work-shared GEMM of all rows between two barriers (which let a thread's
    step read rows another core had computed): see docs/benchmarks.md, 2026-11-27."""
    sz = low.sizes
    p, root, steps = c.gemm.node, stored_node(c.gemm), c.steps
    batch, width = sz.expr(c.view.shape[1]), sz.expr(p.shape[-1])
    length_dim = c.view.shape[0]
    em.open(f"if ({t} % {steps} == 0) {{")
    em(f"{count} = {length} - {t} < {steps} ? {length} - {t} : {steps};",
       f"{lo} = {f'{length} - {t} - {count}' if rev else t};")
    s = em.fresh("s")
    em.open(f"for (int64_t {s} = 0; {s} < {count}; {s}++) {{")
    first = (var(lo) + var(s)) * batch + var(rows.r0)  # this thread's first row of the step, in the sequence
    a_view, vb = low.operand_views(p, ctx, a_row=first)
    out = f"({chunk} + {sz.index((var(s) * batch + var(rows.r0)) * width)})"
    ep_info: list = []
    epilogue = low.gemm_epilogue(p, root if root is not p else None, ctx, ep_info)

    def global_rows(idx: list[Expr], acc: str, lanes: int, lane: str) -> tuple[list[str], list[str], str]:
        """The epilogue reads its other operands (a bias) at the row of the whole sequence."""
        return epilogue([idx[0] + first, *idx[1:]], acc, lanes, lane)

    columns = [("0", sz(p.shape[-1]))]
    tile = low.tile(c.gemm)
    buf, _ = low.packed_b(p, tile, vb, columns, resident=False)
    pack_panels(low, before, tile, sz(p.srcs[0].shape[-1]), vb, columns, buf, shared=True)
    outer, outer_rows = low.sizes, low.rows
    low.sizes, low.rows = _with_steps(outer, length_dim, count), rows  # this thread's rows: no work sharing
    try:
        emit_gemm(low, em, p, tile, [a_view, vb], out, buf, buf, global_rows if epilogue else None, c.gemm.pack_a,
                  c.gemm.k_split, lanes=c.gemm.lanes, m=rows.nrow)
    finally:
        low.sizes, low.rows = outer, outer_rows
    em.close()
    em.close()


def _with_steps(sz: Sizes, length_dim: int, count: str) -> Sizes:
    """Sizes in which the scan's length — a symbol, or a size derived from one (after a strided conv) — is this
    chunk's step count (so the GEMM has count * N rows)."""
    name = symbol_name(length_dim)
    if name is not None:
        return sz.with_local(name, count)
    if not isinstance(length_dim, Dim):
        raise ValueError("a chunked projection needs a run-time sequence length")
    return sz.with_local_size(length_dim, count)
