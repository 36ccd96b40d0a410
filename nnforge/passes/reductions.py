"""Hoisting reductions over a scan out of it: a carry that only accumulates becomes one op after the loop.

A backward scan carries parameter gradients: ``dW = dW + x_tᵀ @ dg_t`` and ``db = db + dg_t`` every step. Per
step that is a small ``[P, N] @ [N, Q]`` GEMM whose result (all of ``dW``, read and written: 2.4 MB at H = 384)
goes through memory each step, plus one more kernel and barrier. Summed over the steps it is a single GEMM with
K = T * N:

    dW = dW0 + reshape(X, [T*N, P])ᵀ @ reshape(DG, [T*N, Q])        (X: the scan's xs, DG: dg_t stacked)
    db = db0 + sum(DG, axis 0)

so the carry is dropped, ``dg_t`` becomes a new stacked output (ys) of the scan, and the GEMM / sum runs once
after it. Applies when the carry's only use in the body is ``carry + term`` and that sum is the carry's next
value, with ``term`` either ``permute(x_t) @ d_t`` (x_t one of the scan's xs, 2-D, or any 2-D step value, then stacked
too: a GRU's ``(r * h)ᵀ @ dn`` for its W_hn) or any value shaped like the carry. Summing in a different order
changes float rounding, so this pass belongs to the CPU pipeline.
"""

from __future__ import annotations

from ..ir.build import make
from ..ir.node import Graph, Node, users
from ..ir.ops import Op
from ..schedule import Target
from .rewrite import replace_scan_results, step_rows
from .rows import RowSplit, worth_splitting


def _term(body: Graph, k: int, nc: int, nx: int) -> tuple[str, Node, int | Node] | None:
    """("matmul", d_t, a_t) — ``a_t`` an xs index, or a 2-D body value to stack too — or ("sum", d_t, -1) when
    carry ``k`` only accumulates, else None."""
    carry, nxt = body.inputs[k], body.outputs[k]
    if nxt.op != Op.ADD or not nxt.dtype.is_float or carry not in nxt.srcs or nxt.srcs[0] is nxt.srcs[1]:
        return None
    us = users(body.order)
    if [id(u) for u in us.get(id(carry), [])] != [id(nxt)] or any(o is carry for o in body.outputs):
        return None
    if len(us.get(id(nxt), [])) or sum(o is nxt for o in body.outputs) != 1:
        return None  # the running sum is read inside the body, or is also a ys
    term = nxt.srcs[1] if nxt.srcs[0] is carry else nxt.srcs[0]
    if tuple(term.shape) != tuple(carry.shape) or term.dtype != carry.dtype:
        return None  # a broadcast add: not a plain sum of the term
    xs = {id(p): j for j, p in enumerate(body.inputs) if nc <= j < nc + nx}
    consts = {id(p) for j, p in enumerate(body.inputs) if j >= nc + nx}
    if term.op == Op.MATMUL and term.ndim == 2:
        a, d = term.srcs
        if a.op == Op.PERMUTE and tuple(a.attrs["perm"]) == (1, 0) and d.ndim == 2:
            v = a.srcs[0]
            if id(v) in xs:
                return "matmul", d, xs[id(v)]
            if v.ndim == 2 and id(v) not in consts and v is not carry:
                return "matmul", d, v  # a step value (a GRU's r * h): stacked beside d_t
    return "sum", term, -1


def _bytes(n: Node) -> float:
    try:
        count = 1
        for d in n.shape:
            count *= int(d)
        return count * n.dtype.itemsize
    except (TypeError, ValueError):
        return float("inf")  # a run-time size


def _hoist_reductions(n: Node, target: Target, read_transposed: set[int]) -> tuple[Node, dict[int, Node]] | None:
    """The new scan and, for each accumulating carry's index, the value after the loop that replaces it."""
    a = n.attrs
    nc, nx = a["n_carry"], a["n_xs"]
    body: Graph = a["body"]
    if body.effects or nx == 0:
        return None
    found = {k: t for k in range(nc) if (t := _term(body, k, nc, nx)) is not None}
    outer = {k for k, t in found.items() if t[0] == "matmul"}
    min_bytes = target.reduction_hoist_bytes
    big = {k for k in outer if _bytes(body.inputs[k]) >= min_bytes}
    if big:
        return _hoisted(n, found, big, read_transposed)
    if not outer:
        return None
    # Smaller accumulators go too when taking them all out leaves a body whose batch rows are independent: the
    # backend then runs the loop with the rows split among workers, no barrier per step (``passes.rows``; the
    # measurements behind the CPU's threshold are in ``codegen.c.target``).
    r = _hoisted(n, found, outer, read_transposed)
    return r if isinstance(worth_splitting(r[0], target), RowSplit) else None


def _hoisted(n: Node, found: dict[int, tuple[str, Node, int]], gemms: set[int],
             read_transposed: set[int]) -> tuple[Node, dict[int, Node]]:
    a = n.attrs
    nc = a["n_carry"]
    body: Graph = a["body"]
    stacked_d = {id(found[k][1]) for k in gemms}
    found = {k: t for k, t in found.items() if id(t[1]) in stacked_d}  # d_t stacked anyway: all its sums go
    T = n.srcs[nc].shape[0]
    stacked: list[Node] = []  # new ys, each distinct d_t (and step value a_t) once
    for _, d, v in found.values():
        for m in (d, v) if isinstance(v, Node) else (d,):
            if all(s is not m for s in stacked):
                stacked.append(m)
    keep = [k for k in range(nc) if k not in found]
    inputs = [body.inputs[k] for k in keep] + list(body.inputs[nc:])
    outputs = [body.outputs[k] for k in keep] + list(body.outputs[nc:]) + stacked
    types = [n.types[k] for k in keep] + list(n.types[nc:]) + [((T, *d.shape), d.dtype) for d in stacked]
    srcs = tuple(n.srcs[k] for k in keep) + n.srcs[nc:]
    scan = make(Op.SCAN, srcs, {**a, "body": Graph(inputs, outputs, body.effects), "n_carry": len(keep)},
                tuple(types), loc=n.loc)
    base = len(types) - len(stacked)
    after: dict[int, Node] = {}
    def stacked_result(m: Node) -> Node:
        return make(Op.PROJ, (scan,), {"index": base + next(i for i, s in enumerate(stacked) if s is m)}, loc=n.loc)

    for k, (kind, d, j) in found.items():
        ds = stacked_result(d)
        if kind == "sum":
            total = make(Op.SUM, (ds,), {"axes": (0,), "keepdims": False}, loc=n.loc)
        else:
            x = stacked_result(j) if isinstance(j, Node) else n.srcs[j]  # [T, N, P]
            flat_x, flat_d = step_rows(x, n.loc), step_rows(ds, n.loc)
            if k in read_transposed:
                # its readers take dWᵀ (the autodiff of x @ Wᵀ): compute dWᵀ = dgᵀ @ x straight into place and let
                # simplify cancel the two transposes, instead of a GEMM and a transposing copy of the result
                dt = make(Op.PERMUTE, (flat_d,), {"perm": (1, 0)}, loc=n.loc)
                total = make(Op.PERMUTE, (make(Op.MATMUL, (dt, flat_x), loc=n.loc),), {"perm": (1, 0)}, loc=n.loc)
            else:
                xt = make(Op.PERMUTE, (flat_x,), {"perm": (1, 0)}, loc=n.loc)
                total = make(Op.MATMUL, (xt, flat_d), loc=n.loc)
        after[k] = make(Op.ADD, (n.srcs[k], total), loc=n.loc)
    return scan, after


def hoist_reductions(graph: Graph, target: Target) -> Graph:
    """Replace accumulating carries of top-level scans by one GEMM / sum after the loop (see module doc).

    Outer-product carries of at least ``target.reduction_hoist_bytes`` are hoisted (then every other carry summing
    the same ``d_t``, which is stacked anyway): a smaller one stays hot in cache while it accumulates, whereas
    stacking ``d_t`` for all steps costs T * N * Q of memory traffic. Smaller ones are hoisted too when that makes
    the loop row-separable (see ``_hoist_reductions``).

    Scans are rewritten in order, each on its already rewritten sources: a layer's backward scan reads the one
    of the layer above, and a new scan made from the old sources would keep the old one of that layer alive (two
    backward recurrences per layer)."""
    us = users(graph.order)
    read_transposed: dict[int, set[int]] = {}  # scan -> carries whose every reader is a 2-D transpose
    for n in graph.order:
        if n.op == Op.PROJ and n.srcs[0].op == Op.SCAN and us.get(id(n)) and all(
                u.op == Op.PERMUTE and tuple(u.attrs["perm"]) == (1, 0) for u in us[id(n)]):
            read_transposed.setdefault(id(n.srcs[0]), set()).add(n.attrs["index"])
    return replace_scan_results(
        graph, lambda node, original: _hoist_reductions(node, target, read_transposed.get(id(original), set())))
