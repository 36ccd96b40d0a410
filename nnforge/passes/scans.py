"""Scan passes."""

from __future__ import annotations

from collections.abc import Sequence

from ..ir import builders as b
from ..ir.build import make, rebuild
from ..ir.builders import flipped_axes, unflipped
from ..ir.dims import same_size
from ..ir.node import Graph, Node, users
from ..ir.ops import ELEMENTWISE, Op
from .products import read_as_product_rows
from .rewrite import redirect_results, rewrite_top, step_rows, substitute


def merge_augmented_scans(graph: Graph) -> Graph:
    """Let forward users of a scan read the augmented copy that autodiff made of it.

    Differentiating a scan creates a copy whose body also stacks the per-step carries; its first results equal
    the original's. Re-pointing the original's readers at the copy runs the forward recurrence once, not twice.
    The original is found by its body and sources, not only as the node the copy was made from: tracing a
    function rebuilds both when it turns captured parameters into inputs (a module's ``loss.backward()``), and
    the copy's link then names a node the graph no longer has.
    """
    def key(n: Node, body: Graph) -> tuple:
        return id(body), tuple(id(s) for s in n.srcs)

    augmented: dict[object, Node] = {}
    for n in graph.order:
        if n.op == Op.SCAN and "primal" in n.attrs:
            primal = n.attrs["primal"]
            augmented[id(primal)] = augmented[key(n, primal.attrs["body"])] = n
    target: dict[int, Node] = {}  # a result of an original -> the augmented copy that computes it too
    for n in graph.order:
        if n.op != Op.PROJ or n.srcs[0].op != Op.SCAN or "primal" in n.srcs[0].attrs:
            continue
        scan = n.srcs[0]
        aug = augmented.get(id(scan)) or augmented.get(key(scan, scan.attrs["body"]))
        if aug is not None and _same_loop(scan, aug):
            target[id(n)] = aug
    if target:
        graph = redirect_results(graph, target)

    def strip(n: Node) -> dict | None:
        return {k: v for k, v in n.attrs.items() if k != "primal"} if "primal" in n.attrs else None

    return substitute(graph, {}, attrs_fn=strip)


def _same_loop(scan: Node, aug: Node) -> bool:
    """The attributes other than the body and the link agree (direction, length, carry and xs counts)."""
    skip = ("body", "primal")
    return {k: v for k, v in scan.attrs.items() if k not in skip} == {
        k: v for k, v in aug.attrs.items() if k not in skip}


def scans_of_flipped_sequences(graph: Graph) -> Graph:
    """A scan whose every sequence is flipped in time runs the other way over the sequences themselves; its
    stacked outputs are flipped in their place, a view that cancels against the flip that usually follows.

    A recurrent layer written to run backwards by flipping (Bonito's RNN wrapper: ``lstm(x.flip(0)).flip(0)``,
    as ``from_torch`` captures it) then reads its input and writes its output where they are, as ``reverse=True``
    does, instead of copying the sequence reversed before and after. One walk in topological order: flips move
    after the per-step ops between them and the scan (its input projection), flips of flips cancel, and each scan
    is turned on sources already rewritten, so a stack of layers alternating direction turns layer by layer.
    Exact: each step computes what it did."""
    turned: set[int] = set()

    def rule(node: Node, original: Node) -> Node | None:
        if (back := unflipped(node)) is not None:
            return back
        if node.op == Op.PROJ and id(original.srcs[0]) in turned:
            return b.flip(node, 0) if node.attrs["index"] >= node.srcs[0].attrs["n_carry"] else None
        if node.op == Op.SCAN:
            nc, nx = node.attrs["n_carry"], node.attrs["n_xs"]
            xs = node.srcs[nc:nc + nx]
            if not xs or any(flipped_axes(x) != frozenset({0}) for x in xs):
                return None
            turned.add(id(original))
            srcs = (*node.srcs[:nc], *(x.srcs[0] for x in xs), *node.srcs[nc + nx:])
            return rebuild(node, srcs, {**node.attrs, "reverse": not node.attrs["reverse"]})
        return _flip_after(node)

    return rewrite_top(graph, rule)


def _flip_after(n: Node) -> Node | None:
    """``op(flip(x), ...)`` as ``flip(op(x, ...))`` along the time axis, for an op that computes each time step
    on its own: element-wise, a product batched over time (the input projection of a layer that flips its
    sequence), a view that keeps the time axis first. Every other operand must be flipped too, or the same at
    every step (broadcast along time). A sum or maximum over time reads its operand unflipped (a weight's
    gradient summed over the steps: the order of the terms changes, their sum does not)."""
    if n.op in (Op.SUM, Op.REDUCE_MAX) and 0 in n.attrs["axes"] and flipped_axes(n.srcs[0]) == frozenset({0}):
        return rebuild(n, (n.srcs[0].srcs[0],))
    if _keeps_time_first(n) and flipped_axes(n.srcs[0]) == frozenset({0}):
        return b.flip(rebuild(n, (n.srcs[0].srcs[0],)), 0)
    if not (n.op in ELEMENTWISE or (n.op == Op.MATMUL and n.ndim > 2)) or not n.ndim:
        return None
    flipped = [flipped_axes(s) == frozenset({0}) for s in n.srcs]
    if not any(flipped) or not all(f or _same_along_time(s) for f, s in zip(flipped, n.srcs)):
        return None
    inner = rebuild(n, tuple(s.srcs[0] if f else s for f, s in zip(flipped, n.srcs)))
    return b.flip(inner, 0)


def _same_along_time(n: Node) -> bool:
    """Whether every step along axis 0 of ``n`` holds the same values: a constant, a broadcast along time (a
    weight that a product batched over time reads), and views and element-wise ops of such values."""
    if not n.ndim:
        return False
    if n.op == Op.CONST or int(n.shape[0]) == 1:
        return True
    if n.op == Op.EXPAND:
        return n.srcs[0].ndim == n.ndim and int(n.srcs[0].shape[0]) == 1
    if _keeps_time_first(n):
        return _same_along_time(n.srcs[0])
    return n.op in ELEMENTWISE and all(_same_along_time(s) for s in n.srcs)


def _keeps_time_first(n: Node) -> bool:
    """Whether view ``n`` keeps its source's axis 0 first, whole: a permute that leaves it, a reshape of the other
    axes."""
    if n.op not in (Op.PERMUTE, Op.RESHAPE) or not n.ndim or not n.srcs[0].ndim:
        return False
    if n.op == Op.PERMUTE:
        return n.attrs["perm"][0] == 0
    return same_size(n.shape[0], n.srcs[0].shape[0])


def carries_read_from_outputs(graph: Graph) -> Graph:
    """The carries a scan stacked for a weight gradient's product are read from the scan's stacked output of the
    same carry, one step shifted, and the initial carry for the first step (``carries_from_outputs``).

    Autodiff's augmented forward stacks the carry each step starts from (``grad.scan_vjp``); for an LSTM's h that
    is ``[h0, ys[0], ..., ys[T-2]]``, the stacked output again, stored a second time at every step, though what
    reads it is only the product for ``dW_hh`` after the loops (``hoist_reductions``: ``Dᵀ @ H`` over all
    ``T * N`` rows). The stack becomes a concatenation of views of stored arrays, which
    ``products.products_of_stacked_rows`` splits into one product per part, and ``dce`` drops the stack. Applies
    where every reader of the stack is such a product (``read_as_product_rows``); anything else still reads it."""
    us = users(graph.order)
    results = {id(o) for o in graph.outputs}
    stacks = {id(n): found for n in graph.order
              if (found := stacked_carry(n)) is not None and read_as_product_rows(n, us, results)}
    if not stacks:
        return graph

    def rule(node: Node, original: Node) -> Node | None:
        return carries_from_outputs(node.srcs[0], *stacks[id(original)], original.loc) if id(original) in stacks \
            else None

    return rewrite_top(graph, rule)


def carries_from_outputs(scan: Node, k: int, j: int, loc: object) -> Node:
    """The ``[T, N, H]`` stack of the values carry ``k`` of ``scan`` has when each step starts, as a concatenation
    of its initial value and the scan's stacked output ``j`` of the carry's new values, one step shifted (a
    reverse scan's first step is its last). Sizes stay symbolic: the initial value fills ``first_steps(T)`` steps
    (``min(T, 1)``), so a scan of no steps stacks nothing."""
    ys = b.proj(scan, j)
    T = ys.shape[0]
    first = first_steps(T)
    init = b.slice_axis(b.unsqueeze(scan.srcs[k], 0), 0, 0, first)
    if scan.attrs["reverse"]:
        parts = (b.slice_axis(ys, 0, first, T), init)
    else:
        parts = (init, b.slice_axis(ys, 0, 0, T - first))
    return make(Op.CONCAT, parts, {"axis": 0}, loc=loc)


def stacked_carry(n: Node) -> tuple[int, int] | None:
    """For a ``[T, N, H]`` result of a top-level scan that stacks a carry's value at the start of each step:
    (the carry, a stacked output of that carry's new value); else None."""
    if n.op != Op.PROJ or n.srcs[0].op != Op.SCAN or n.ndim != 3:
        return None
    scan = n.srcs[0]
    body: Graph = scan.attrs["body"]
    nc = scan.attrs["n_carry"]
    out = body.outputs[n.attrs["index"]]
    k = next((k for k in range(nc) if body.inputs[k] is out), None)
    if k is None or scan.srcs[k].ndim != 2:
        return None
    j = next((j for j in range(nc, len(body.outputs)) if body.outputs[j] is body.outputs[k]), None)
    return None if j is None else (k, j)


def first_steps(T: int) -> int:
    """``min(T, 1)`` for a length ``T >= 0`` in the operations a symbolic size keeps (``2T // (T + 1)``)."""
    return (2 * T) // (T + 1)


def stacked_parts_read_as_views(graph: Graph) -> Graph:
    """A scan's stacked output that is a run of columns of another one is read as a view of that one.

    A GRU's backward stacks its three gate gradients joined (``concat(dr, dz, dn)``, for the input projection's
    gradients) and again ``concat(dr, dz)`` and ``dn`` for the gradients of the weights they multiply: every step
    stores each value twice. The same bytes are columns of the first stack; its readers read ``[T * N, W]`` rows
    sliced to those columns (a GEMM reads them through strides), and ``dce`` drops the copies. A value is such a
    run where the other's body value is a ``concat`` along the last axis and it is one of its parts, or a concat of
    consecutive ones."""
    columns: dict[tuple[int, int], tuple[int, int, int]] = {}  # (scan, stacked output) -> (j, lo, hi) of another
    for scan in graph.order:
        if scan.op == Op.SCAN:
            body: Graph = scan.attrs["body"]
            nc = scan.attrs["n_carry"]
            for i in range(nc, len(body.outputs)):
                found = _columns_of(body.outputs[i], body.outputs, nc)
                if found is not None:
                    columns[id(scan), i] = found
    if not columns:
        return graph

    def rule(node: Node, original: Node) -> Node | None:
        if original.op != Op.PROJ or (id(original.srcs[0]), original.attrs["index"]) not in columns:
            return None
        j, lo, hi = columns[id(original.srcs[0]), original.attrs["index"]]
        scan = node.srcs[0]  # rebuilt on its rewritten sources where they changed (a scan reading such a view)
        T, N, _ = scan.types[j][0]
        rows = step_rows(b.proj(scan, j), original.loc)
        return make(Op.RESHAPE, (b.slice_axis(rows, 1, lo, hi),), {"shape": (T, N, hi - lo)}, loc=original.loc)

    return rewrite_top(graph, rule)


def _columns_of(v: Node, outputs: Sequence[Node], nc: int) -> tuple[int, int, int] | None:
    """(j, lo, hi): stacked output ``j`` (another) holds ``v`` as its columns ``lo:hi``; None if none does. Only
    ``[N, W]`` values (a step's rows)."""
    if v.ndim != 2:
        return None
    parts = _row_parts(v) or (v,)
    for j in range(nc, len(outputs)):
        whole = _row_parts(outputs[j]) if outputs[j] is not v else None
        for start in range(len(whole or ()) - len(parts) + 1):
            if all(a is p for a, p in zip(whole[start:start + len(parts)], parts)):
                lo = sum(int(s.shape[1]) for s in whole[:start])
                return j, lo, lo + int(v.shape[1])
    return None


def _row_parts(v: Node) -> tuple[Node, ...] | None:
    """The parts of ``v``, an ``[N, W]`` concat along its rows' last axis; None for anything else."""
    return v.srcs if v.op == Op.CONCAT and v.ndim == 2 and v.attrs["axis"] in (1, -1) else None
