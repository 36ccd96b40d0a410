"""A ``Rows`` kernel: consecutive kernels over the same rows (a layer norm's or a softmax's reductions and
elementwise kernels) as one Triton kernel whose programs take ``BR`` whole rows each.

A program's rows are a ``[BR, C]`` tile (C: the row's width padded to a power of two, the columns past it masked).
Each member is evaluated on the tile in order: a reduction's row values are ``[BR, 1]`` (``tl.sum`` / ``tl.max`` over
the columns), an elementwise member's values the tile itself; each member stores its results as its own kernel
would, and later members read earlier ones' values from the registers they were computed in (the schedule made
sure every such read is at the element or the row being computed: ``schedule/row_programs.py``), so a row is read
from memory once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...dtypes import DType
from ...ir.node import Node
from ...ir.ops import Op
from ...schedule import Buf, Gemm, Reduce, Rows, stored_node
from .evaluate import Ctx, Emitter, Eval
from .texpr import acc_dtype, rounded

if TYPE_CHECKING:
    from .render import Renderer


def render_rows(r: Renderer, k: Rows, ctx: Ctx, dests: Callable[[Buf, tuple[int, ...]], list[str]]) -> None:
    """``k``'s members, one program per ``BR`` rows, each stored member into ``dests(out, also)`` (its buffer and
    its extra results), which later kernels of ``ctx`` then read."""
    outs = [dests(m.out, m.also) if kept else [] for m, kept in zip(k.members, k.stores)]
    _render(r, k, ctx, outs)
    for m, o in zip(k.members, outs):
        if o:
            ctx.buffers[id(stored_node(m))] = o[0]


def _render(r: Renderer, k: Rows, ctx: Ctx, outs: list[list[str]]) -> None:
    """The kernel: each member on the program's ``[BR, C]`` tile in order, into ``outs`` (none: held only)."""
    sz = r.sz
    width = k.width
    gemm = k.members[0] if isinstance(k.members[0], Gemm) else None
    cols = 1 << (width - 1).bit_length()
    n_rows = sz.prod(k.lead)
    # ``row_elements`` values of 4 bytes a program (float64 rows: half as many), and no more rows than there are
    wide = max(4, *(m.node.dtype.itemsize for m in k.members))
    block = max(1, r.tiles.row_elements * 4 // wide // cols)
    batch = tuple(gemm.node.shape[:-2]) if gemm is not None else ()
    per = k.lead[-1:] if batch else k.lead  # the rows a program's rows come from: a batch's product's, or all
    if all(sz.is_static(d) for d in per):
        block = min(block, 1 << max(0, int(sz.prod(per)) - 1).bit_length())
    consts = {"BR": block}
    if gemm is not None:  # a tile of whole rows of the product: tl.dot takes 16 rows and columns at least
        cols, block = max(cols, 16), max(block, 16)
        depth = r.static(gemm.node.srcs[0].shape[-1])
        consts = {"BR": block, "BK": r.tiles.row_gemm_k(depth, gemm.node.dtype.is_half)}
    em = Emitter()
    prologue = ["pid = tl.program_id(0).to(tl.int64)"]
    if batch:  # a batch of products: each program's rows within one product (they share its B)
        M = sz(gemm.node.shape[-2])  # type: ignore[union-attr]
        prologue += [f"tiles = ({M} + BR - 1) // BR", "pid_b = pid // tiles",
                     "rm = (pid % tiles) * BR + tl.arange(0, BR)[:, None]", f"rows = pid_b * {M} + rm",
                     f"mr = rm < {M}"]
        grid = f"({sz.prod(batch)}) * triton.cdiv({M}, {block})"
    else:
        prologue += ["rows = pid * BR + tl.arange(0, BR)[:, None]", f"mr = rows < {n_rows}"]
        prologue += ["rm = rows"] if gemm is not None else []
        grid = f"triton.cdiv({n_rows}, {block})"
    prologue += [f"c = tl.arange(0, {cols})[None, :]", f"m = mr & (c < {width})"]
    if gemm is not None:
        prologue += ["rn = c", f"acc = tl.zeros([BR, {cols}], {acc_dtype(gemm.node.dtype)})"]
    # each row's index along the leading axes (0 along those of size 1, as a view's index map makes it)
    lead = ["0"] * len(k.lead)
    big = [a for a, d in enumerate(k.lead) if not (sz.is_static(d) and int(d) == 1)]  # type: ignore[call-overload]
    for a, e in zip(big, Eval(em, ctx, sz, None, 2, hoist=False).unflatten("rows", [sz(k.lead[a]) for a in big])):
        lead[a] = e
    dims = [sz(d) for d in k.lead]
    element = (*lead, "c")
    hints = {(element, (*dims, sz(width))): f"(rows * {width} + c)", (tuple(lead), tuple(dims)): "rows",
             ((*lead, "0"), (*dims, "1")): "rows"}

    def own(n: Node) -> tuple[str, ...]:
        """A per-row value's index at the program's rows (its shape the leading axes, or them and a 1)."""
        return tuple(lead) if n.ndim == len(lead) else (*lead, "0")

    held: dict[tuple[int, tuple[str, ...]], str] = {}  # earlier members' values, where later ones read them
    memo: dict[tuple[int, tuple[str, ...]], str] = {}  # values at the rows' elements, computed once

    def evaluator(mask: str, root: Node | None = None) -> Eval:
        ev = Eval(em, ctx, sz, mask, 2, root=root, overrides=held, flat_hint=hints, hoist=False)
        if mask == "m":
            ev.memo = memo
        return ev

    for m, bufs in zip(k.members, outs):
        if isinstance(m, Gemm):
            bidx = r.product_index(em, ctx, batch)
            at = (*bidx, "rm", "c") if batch else ("rows", "c")  # the product's own index of the program's rows
            value = _product_rows(r, m, ctx, em, bidx, at)
            for o in bufs:
                em.line(f"tl.store({o} + (rows * {width} + c), {value}, mask=m)")
            held[(id(stored_node(m)), at)] = held[(id(stored_node(m)), element)] = value
            on_rows = Eval(em, ctx, sz, "m", 2, overrides={(id(stored_node(m)), at): value}, hoist=False)
            for view in k.views:
                held[(id(view), element)] = on_rows.val(view.srcs[0], at)
            continue
        if not isinstance(m, Reduce):
            value = evaluator("m", m.node).val(m.node, element)
            for o in bufs:
                em.line(f"tl.store({o} + (rows * {width} + c), {value}, mask=m)")
            held[(id(m.node), element)] = value
            continue
        p = m.node
        res = em.tmp(_row_reduction(p, evaluator("m"), element), "s", hoist=False)
        if p.dtype.is_half:
            res = em.tmp(rounded(res, p.dtype), "s", hoist=False)
        value = res
        if m.epilogue is not None:
            ev = evaluator("mr", m.epilogue)
            ev.overrides[(id(p), own(p))] = res
            value = ev.val(m.epilogue, own(m.epilogue))
        for o in bufs:
            em.line(f"tl.store({o} + rows, {value}, mask=mr)")
        held[(id(stored_node(m)), own(stored_node(m)))] = value
    # built for sm_90, a float32 product's tile of 16 rows of 384 or 512 took 234 registers a thread on 4 warps
    # (90 on 8); a half-precision one 108 / 156 on 4 warps, and spilled on 8
    warps = None if gemm is None else r.tiles.gemm_warps
    if gemm is not None and not gemm.node.dtype.is_half and block * cols >= 8192:
        warps = 2 * r.tiles.gemm_warps
    r.emit(k.kind, em, [grid], consts, prologue, warps=warps)


def _product_rows(r: Renderer, m: Gemm, ctx: Ctx, em: Emitter, bidx: tuple[str, ...], at: tuple[str, ...]) -> str:
    """The program's rows of GEMM ``m`` (of product ``bidx`` of a batch; its accumulator ``acc`` summed over K,
    then rounded to a half-precision product's dtype and its epilogue), as an expression over the ``[BR, C]``
    tile at the product's index ``at``."""
    p = m.node
    r.k_loop(em, ctx, p, bidx)
    value = "acc" if not p.dtype.is_half else em.tmp(rounded("acc", p.dtype), "acc", hoist=False)
    if m.epilogue is None:
        return value
    ev = Eval(em, ctx, r.sz, "m", 2, root=m.epilogue, overrides={(id(p), at): value}, hoist=False)
    return ev.val(m.epilogue, at)


def _row_reduction(p: Node, ev: Eval, element: tuple[str, ...]) -> str:
    """Reduction ``p`` over each row of the tile, as a ``[BR, 1]`` expression: a sum in its accumulator's dtype, a
    float max NaN where the row holds one (as the reduction kernels do), an integer max."""
    acc = acc_dtype(p.dtype)
    if p.op == Op.SUM:
        return f"tl.sum({ev.masked(p.srcs[0], element)}.to({acc}), axis=1)[:, None]"
    v = ev.tmp(f"{ev.val(p.srcs[0], element)}.to({acc})")
    if p.dtype.is_float:
        return f"nf_max(tl.where(m, {v}, -float(\"inf\")), 1)[:, None]"
    least = -(2 ** 63) if p.dtype == DType.int64 else -(2 ** 31)
    return f"tl.max(tl.where(m, {v}, {least}), axis=1)[:, None]"
