"""Scan passes."""

from __future__ import annotations

from ..ir.build import make, rebuild
from ..ir.node import Graph, Node, toposort
from ..ir.ops import Op
from .rewrite import substitute


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
        graph = _repointed(graph, target)

    def strip(n: Node) -> dict | None:
        return {k: v for k, v in n.attrs.items() if k != "primal"} if "primal" in n.attrs else None

    return substitute(graph, {}, attrs_fn=strip)


def _repointed(graph: Graph, target: dict[int, Node]) -> Graph:
    """``graph`` with each result ``p`` of an original scan read from ``target[id(p)]`` instead. The copy of a
    later layer reads an earlier layer's results, so the copies are rebuilt first (an order in which each
    re-pointed result comes after its copy), and every replacement reads rebuilt sources."""
    def deps(n: Node) -> tuple[Node, ...]:
        return (target[id(n)],) if id(n) in target else n.srcs

    new: dict[int, Node] = {}
    for n in toposort([*graph.outputs, *graph.effects], graph.inputs, deps):
        if id(n) in target:
            new[id(n)] = make(Op.PROJ, (new[id(target[id(n)])],), n.attrs, loc=n.loc)
        else:
            srcs = tuple(new[id(s)] for s in n.srcs)
            new[id(n)] = n if srcs == n.srcs else rebuild(n, srcs)
    return Graph(list(graph.inputs), [new[id(o)] for o in graph.outputs], [new[id(e)] for e in graph.effects])


def _same_loop(scan: Node, aug: Node) -> bool:
    """The attributes other than the body and the link agree (direction, length, carry and xs counts)."""
    skip = ("body", "primal")
    return {k: v for k, v in scan.attrs.items() if k not in skip} == {
        k: v for k, v in aug.attrs.items() if k not in skip}
