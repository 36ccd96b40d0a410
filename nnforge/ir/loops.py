"""Building loops on the IR: closing a body over its free values, and scan nodes made from nodes.

Code below the frontend (autodiff's reversed scan) builds its scans here; ``nnforge.control.scan`` traces user
bodies into the same kind of node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..dtypes import DType
from .build import make, rebuild
from .node import Graph, Node, toposort
from .ops import Op


def placeholder(shape: tuple, dtype: DType, name: str) -> Node:
    """An input of a graph or loop body."""
    return make(Op.INPUT, (), {"name": name, "shape": tuple(shape), "dtype": dtype})


def close_body(placeholders: Sequence[Node], outputs: Sequence[Node], effects: Sequence[Node] = (),
               effectful: Iterable[int] = ()) -> tuple[Graph, list[Node]]:
    """A body Graph whose only free values are explicit inputs, and the outer values those extra inputs take.

    Inner nodes are the ones that depend on a placeholder or are effects made inside the body (``effects``,
    and the nodes whose ids are in ``effectful``). Any other value an inner node reads (a weight, a value
    computed before the loop) becomes a const input; scalar constants are cheap to rebuild and stay inside.
    """
    roots = list(outputs) + list(effects)
    inner: set[int] = {id(p) for p in placeholders} | set(effectful) | {id(e) for e in effects}
    order = toposort(roots)
    for n in order:
        if id(n) not in inner and any(id(s) in inner for s in n.srcs):
            inner.add(id(n))
    consts: list[Node] = []
    const_ids: dict[int, Node] = {}

    def lift(n: Node) -> Node:
        if n.op == Op.CONST:
            return n
        if id(n) not in const_ids:
            const_ids[id(n)] = placeholder(n.shape, n.dtype, f"const{len(consts)}")
            consts.append(n)
        return const_ids[id(n)]

    mapping: dict[int, Node] = {id(p): p for p in placeholders}
    for n in order:
        if id(n) in mapping or id(n) not in inner:
            continue
        srcs = tuple(mapping[id(s)] if id(s) in inner else lift(s) for s in n.srcs)
        mapping[id(n)] = n if srcs == n.srcs else rebuild(n, srcs)
    outs = [mapping[id(o)] if id(o) in inner else lift(o) for o in outputs]
    body_effects = [mapping[id(e)] for e in effects]
    inputs = list(placeholders) + [const_ids[id(c)] for c in consts]
    return Graph(inputs, outs, body_effects), consts


def calls_python(g: Graph) -> bool:
    """Whether ``g``, or a scan or loop body nested in it, has a Feeder or Receiver: code that calls Python on
    every evaluation (what keeps an ``nf.loop`` a side effect, and decides how a backend runs it)."""
    return any(n.op in (Op.FEEDER, Op.RECEIVER)
               or (n.op in (Op.SCAN, Op.LOOP) and calls_python(n.attrs["body"])) for n in g.order)


def scan_node(init: Sequence[Node], xs: Sequence[Node], carry_ph: Sequence[Node], x_ph: Sequence[Node],
              new_carry: Sequence[Node], ys: Sequence[Node], length: Any, reverse: bool = False,
              unroll: int = 1) -> list[Node]:
    """The results (final carries, then stacked ys) of a scan whose body maps the placeholders ``carry_ph`` and
    ``x_ph`` (one step of ``xs``) to ``new_carry`` and ``ys``; the body is closed over what else it reads."""
    graph, consts = close_body([*carry_ph, *x_ph], [*new_carry, *ys])
    types = tuple((c.shape, c.dtype) for c in init) + tuple(((length, *y.shape), y.dtype) for y in ys)
    node = make(Op.SCAN, (*init, *xs, *consts),
                {"body": graph, "n_carry": len(init), "n_xs": len(xs), "reverse": bool(reverse),
                 "unroll": int(unroll), "length": length}, types=types)
    return [make(Op.PROJ, (node,), {"index": i}) for i in range(len(types))]

