"""Scan passes."""

from __future__ import annotations

from ..ir.node import Graph, Node
from ..ir.ops import Op
from .rewrite import redirect_results, substitute


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
