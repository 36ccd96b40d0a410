"""Graph rewriting helpers shared by the passes: substitution and rebuilding in topological order."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..ir.build import make, rebuild
from ..ir.node import Graph, Node, toposort
from ..ir.ops import Op


def substitute(graph: Graph, mapping: Mapping[int, Node], attrs_fn: Callable[[Node], dict | None] | None = None,
               types_fn: Callable[[Node], tuple | None] | None = None) -> Graph:
    """A copy of ``graph`` with nodes replaced per ``mapping`` (id -> node, used as given) and users rebuilt.

    ``attrs_fn``/``types_fn`` may return new attrs/types for any node (None keeps them); inputs are rebuilt too
    when they change. Returns ``graph`` itself when nothing changes, so passes can tell.
    """
    if not mapping and attrs_fn is None and types_fn is None:
        return graph

    def step(n: Node, srcs: tuple[Node, ...]) -> Node:
        if id(n) in mapping:
            return mapping[id(n)]
        attrs = attrs_fn(n) if attrs_fn else None
        types = types_fn(n) if types_fn else None
        return n if srcs == n.srcs and attrs is None and types is None else rebuild(n, srcs, attrs, types)

    return _rebuilt(graph, step)


def rewrite_top(graph: Graph, rule: Callable[[Node, Node], Node | None]) -> Graph:
    """Apply ``rule(node, original)`` to the top-level nodes in topological order, each ``node`` rebuilt on its
    rewritten sources (``original`` is the node of ``graph``, for lookups made on it, such as its readers); unlike
    ``substitute``, a replacement's own sources are rewritten ones too. Returns ``graph`` itself when nothing
    changes. A result (``proj``) of a loop the rule replaced by one with other results cannot be rebuilt on it: the
    rule gets it as it was (``node is original``) and must return its replacement."""

    def step(n: Node, srcs: tuple[Node, ...]) -> Node:
        if n.op == Op.PROJ and srcs[0].types != n.srcs[0].types:
            out = rule(n, n)
            if out is None:
                raise ValueError(f"rewrite: a result of a replaced loop was left unmapped (created at {n.loc})")
            return out
        node = n if srcs == n.srcs else rebuild(n, srcs)
        out = rule(node, n) if n.op != Op.INPUT else None
        return node if out is None else out

    return _rebuilt(graph, step)


def step_rows(ys: Node, loc: object) -> Node:
    """A stacked ``[T, N, P]`` value as one matrix of its ``T * N`` rows: a product over every step at once."""
    return make(Op.RESHAPE, (ys,), {"shape": (ys.shape[0] * ys.shape[1], ys.shape[2])}, loc=loc)


def replace_scan_results(graph: Graph,
                         fn: Callable[[Node, Node], tuple[Node, dict[int, Node]] | None]) -> Graph:
    """Rewrite top-level scans with ``fn(scan, original)``, which returns None or ``(new_scan, after)``: ``after``
    maps a result index of the old scan to the value replacing it (computed after the loop); every other result
    is read from ``new_scan`` at its place among those kept, in order (results the new scan adds come after).
    Scans are rewritten in order, each on its already rewritten sources (``rewrite_top``)."""
    new: dict[int, tuple[Node, dict[int, Node], list[int]]] = {}

    def rule(node: Node, original: Node) -> Node | None:
        if original.op == Op.SCAN:
            r = fn(node, original)
            if r is None:
                return None
            scan, after = r
            new[id(original)] = (scan, after, [i for i in range(len(original.types)) if i not in after])
            return scan
        if original.op != Op.PROJ or id(original.srcs[0]) not in new:
            return None
        scan, after, kept = new[id(original.srcs[0])]
        i = original.attrs["index"]
        if i in after:
            return after[i]
        return make(Op.PROJ, (scan,), {"index": kept.index(i)}, loc=original.loc)

    return rewrite_top(graph, rule)


def redirect_results(graph: Graph, target: Mapping[int, Node]) -> Graph:
    """``graph`` with each loop result ``p`` (a ``proj``) whose id is in ``target`` read from the same result of
    the loop ``target[id(p)]`` instead, that loop rebuilt on rewritten sources like every other node: the loop
    may come later in ``graph``'s order and read other redirected results (a layer's copy of a scan reads the
    layer below), so the walk puts each loop before the results redirected to it."""

    def deps(n: Node) -> tuple[Node, ...]:
        return (target[id(n)],) if id(n) in target else n.srcs

    def step(n: Node, srcs: tuple[Node, ...]) -> Node:
        if id(n) in target:
            return make(Op.PROJ, srcs, n.attrs, loc=n.loc)
        return n if srcs == n.srcs else rebuild(n, srcs)

    return _rebuilt(graph, step, deps)


def _rebuilt(graph: Graph, step: Callable[[Node, tuple[Node, ...]], Node],
             deps: Callable[[Node], tuple[Node, ...]] | None = None) -> Graph:
    """``graph`` with every node replaced by ``step(node, its sources' replacements)``, in topological order
    (with ``deps``: ``step`` gets the replacements of ``deps(node)``, and each node comes after them)."""
    order = graph.order if deps is None else toposort([*graph.outputs, *graph.effects], graph.inputs, deps)
    new: dict[int, Node] = {}
    for n in order:
        new[id(n)] = step(n, tuple(new.get(id(s), s) for s in (n.srcs if deps is None else deps(n))))
    if all(new[id(n)] is n for n in order):
        return graph
    return Graph([new.get(id(i), i) for i in graph.inputs], [new[id(o)] for o in graph.outputs],
                 [new[id(e)] for e in graph.effects])


def map_nodes(graph: Graph, rule: Callable[[Node], Node | None], max_rounds: int = 8) -> Graph:
    """Apply ``rule`` bottom-up (each node sees rewritten sources; None keeps it), bodies included, until a round
    changes nothing. Rewriting a body re-creates its scan/loop node with the new body."""
    for _ in range(max_rounds):
        changed = False
        new: dict[int, Node] = {}
        for n in graph.order:
            srcs = tuple(new.get(id(s), s) for s in n.srcs)
            attrs = None
            body = n.attrs.get("body")
            if isinstance(body, Graph):
                nb = map_nodes(body, rule, max_rounds)
                if nb is not body:
                    attrs = {**n.attrs, "body": nb}
            node = n if srcs == n.srcs and attrs is None else rebuild(n, srcs, attrs)
            out = rule(node) if n.op != Op.INPUT else None
            if out is not None and out is not node:
                node = out
            if node is not n:
                changed = True
            new[id(n)] = node
        if not changed:
            return graph
        graph = Graph([new.get(id(i), i) for i in graph.inputs], [new[id(o)] for o in graph.outputs],
                      [new[id(e)] for e in graph.effects])
    return graph


def rewire_scan(n: Node, changes: Mapping[int, tuple[Node | None, Node | None, Node]]) -> Node:
    """Scan ``n`` with some loop-invariant inputs changed: position k -> (its new outer source, or None to drop
    it; the body's new input there, or None; the node the body reads in place of its old input k — a constant,
    or a view of the new input)."""
    body: Graph = n.attrs["body"]
    inner = substitute(Graph(body.inputs, body.outputs, body.effects),
                       {id(body.inputs[k]): read for k, (_, _, read) in changes.items()})
    keep = [k for k in range(len(n.srcs)) if changes.get(k, (n.srcs[k],))[0] is not None]
    srcs = tuple(changes[k][0] if k in changes else n.srcs[k] for k in keep)
    inputs = [changes[k][1] if k in changes else body.inputs[k] for k in keep]
    return make(Op.SCAN, srcs, {**n.attrs, "body": Graph(inputs, inner.outputs, inner.effects)}, n.types, loc=n.loc)
