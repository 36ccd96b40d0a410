"""The C form of a time-chunked input projection (``schedule.ChunkedInput``; the scheduler decides which and how
many steps): a work-shared GEMM of ``steps * batch`` rows into the chunk buffer every ``steps`` steps of the loop,
between two barriers, with the weights packed once before the loop.
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


def emit_chunk(low: Lowering, em: Emitter, c: ChunkedInput, ctx: GraphCtx, chunk: str, t: str, length: str,
               rev: bool, lo: str, count: str, before: Emitter) -> None:
    """Every ``steps`` time steps: the projection of the next chunk (steps ``lo .. lo + count`` of the sequence,
    in the scan's direction) into ``chunk``, work-shared among the threads between two barriers. The weights are
    packed once, by code added to ``before`` (what runs before the time loop)."""
    sz = low.sizes
    p, root, steps = c.gemm.node, stored_node(c.gemm), c.steps
    a_view, vb = low.operand_views(p, ctx, a_row=var(lo) * sz.expr(c.view.shape[1]))  # the chunk's first row
    length_dim = c.view.shape[0]
    em.open(f"if ({t} % {steps} == 0) {{")
    em(f"{count} = {length} - {t} < {steps} ? {length} - {t} : {steps};",
       f"{lo} = {f'{length} - {t} - {count}' if rev else t};",
       "#pragma omp barrier")
    ep_info: list = []
    epilogue = low.gemm_epilogue(p, root if root is not p else None, ctx, ep_info)

    def global_rows(idx: list[Expr], acc: str, lanes: int, lane: str) -> tuple[list[str], list[str], str]:
        """The epilogue reads its other operands (a bias) at the row of the whole sequence."""
        return epilogue([idx[0] + var(lo) * sz.expr(c.view.shape[1]), *idx[1:]], acc, lanes, lane)

    columns = [("0", sz(p.shape[-1]))]
    tile = low.tile(c.gemm)
    buf, _ = low.packed_b(p, tile, vb, columns, resident=False)
    pack_panels(low, before, tile, sz(p.srcs[0].shape[-1]), vb, columns, buf, shared=True)
    outer = low.sizes
    low.sizes = _with_steps(outer, length_dim, count)
    try:
        emit_gemm(low, em, p, tile, [a_view, vb], chunk, buf, buf, global_rows if epilogue else None, c.gemm.pack_a,
                  c.gemm.k_split, lanes=c.gemm.lanes)
    finally:
        low.sizes = outer
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
