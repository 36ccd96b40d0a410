"""Sinking products of a scan's stacked outputs with loop invariants: computed once after the loop.

The backward scan of an LSTM layer whose input needs a gradient computes ``dx_t = dg_t @ W_ih`` every step and
stacks it, while ``dg_t`` (the joined gate gradients) is stacked anyway for the weight gradients
(``reductions``). Per step that is a small ``[N, 4H] @ [4H, I]`` GEMM, and it makes the loop read ``W_ih`` beside
``W_hh``: on the GPU the two no longer fit one persistent program's shared memory (256 KiB at H = 96 in float16),
so the backward of every layer of a stack but the first ran as a host loop. After the loop it is one GEMM with
M = T * N:

    DX = reshape(reshape(DG, [T*N, 4H]) @ W_ih, [T, N, I])        (DG: dg_t stacked)

so ``dg_t`` becomes a stacked output (or stays one) and the body no longer reads ``W_ih``. Applies to a stacked
output ``y_t = d_t @ W`` where ``d_t`` is a 2-D body value, ``W`` a constant of the loop (or its transpose), and
``y_t`` read by nothing else in the body. The same sums in another order after the loop: the result is the same
up to float rounding.
"""

from __future__ import annotations

from ..ir.build import make
from ..ir.node import Graph, Node, users
from ..ir.ops import Op
from .rewrite import replace_scan_results, step_rows


def _invariant(w: Node, consts: dict[int, int]) -> tuple[int, bool] | None:
    """(const index, transposed) when ``w`` is a constant of the loop or its 2-D transpose, else None."""
    if id(w) in consts:
        return consts[id(w)], False
    if w.op == Op.PERMUTE and tuple(w.attrs["perm"]) == (1, 0) and id(w.srcs[0]) in consts:
        return consts[id(w.srcs[0])], True
    return None


def _sunk(n: Node) -> tuple[Node, dict[int, Node]] | None:
    """The new scan and, for each stacked output (its index among the scan's results) computed after the loop,
    the value that replaces it; None where there is none to sink."""
    a = n.attrs
    nc, nx = a["n_carry"], a["n_xs"]
    body: Graph = a["body"]
    if body.effects:
        return None
    consts = {id(p): k for k, p in enumerate(body.inputs) if k >= nc + nx}
    us = users(body.order)
    carried = {id(o) for o in body.outputs[:nc]}
    sink: dict[int, tuple[Node, int, bool]] = {}  # result index -> (d_t, const index, transposed)
    for i in range(nc, len(body.outputs)):
        y = body.outputs[i]
        if y.op != Op.MATMUL or y.ndim != 2 or us.get(id(y)) or id(y) in carried:
            continue
        if sum(o is y for o in body.outputs) != 1:
            continue
        d, w = y.srcs
        inv = _invariant(w, consts)
        if inv is None or d.ndim != 2 or id(d) in consts:
            continue
        sink[i] = (d, *inv)
    if not sink:
        return None
    T = n.types[next(iter(sink))][0][0]  # a stacked output's leading axis: the steps
    outputs = [o for i, o in enumerate(body.outputs) if i not in sink]
    types = [t for i, t in enumerate(n.types) if i not in sink]
    for d, _, _ in sink.values():
        if all(o is not d for o in outputs[nc:]):
            outputs.append(d)
            types.append(((T, *d.shape), d.dtype))
    scan = make(Op.SCAN, n.srcs, {**a, "body": Graph(body.inputs, outputs, body.effects)}, tuple(types),
                loc=n.loc)
    after: dict[int, Node] = {}
    for i, (d, k, transposed) in sink.items():
        j = nc + next(j for j, o in enumerate(outputs[nc:]) if o is d)
        ds = make(Op.PROJ, (scan,), {"index": j}, loc=n.loc)
        w = n.srcs[k]
        if transposed:
            w = make(Op.PERMUTE, (w,), {"perm": (1, 0)}, loc=n.loc)
        y = body.outputs[i]
        prod = make(Op.MATMUL, (step_rows(ds, n.loc), w), loc=y.loc)
        after[i] = make(Op.RESHAPE, (prod,), {"shape": (T, *y.shape)}, loc=y.loc)
    return scan, after


def sink_output_products(graph: Graph) -> Graph:
    """Compute the stacked outputs of top-level scans that are products of a step value with a loop invariant
    after the loop, as one GEMM each (see module doc); the body no longer reads that invariant."""
    return replace_scan_results(graph, lambda node, _: _sunk(node))
