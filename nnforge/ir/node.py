"""Immutable IR nodes and graphs.

A Node is one op applied to source nodes with hashable-ish attributes, plus its inferred shape and dtype.
Nodes never change after construction; passes build new nodes. Ops with several results (scan, loop) have
``types`` instead of a single shape/dtype and are read through ``proj`` nodes. A Graph is a function: input
placeholders, output nodes and side-effect roots (receivers, loops run for their effects).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from ..dtypes import DType
from .ops import Op
from .printer import format_graph

Shape = tuple[int, ...]


class Node:
    """One IR value. ``loc`` is the user's ``file:line`` that created it (used in error messages only)."""

    __slots__ = ("__weakref__", "attrs", "dtype", "loc", "op", "shape", "srcs", "types")

    def __init__(self, op: Op, srcs: tuple[Node, ...], attrs: Mapping[str, Any], shape: Shape | None,
                 dtype: DType | None, loc: str = "", types: tuple[tuple[Shape, DType], ...] | None = None):
        init = object.__setattr__
        init(self, "op", op)
        init(self, "srcs", srcs)
        init(self, "attrs", MappingProxyType(dict(attrs)))
        init(self, "shape", shape)
        init(self, "dtype", dtype)
        init(self, "types", types)
        init(self, "loc", loc)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("IR nodes are immutable")

    def __repr__(self) -> str:
        shape = "x".join(str(int(d)) for d in self.shape) if self.shape is not None else "multi"
        return f"<{self.op.name.lower()} {shape} {self.dtype.short if self.dtype else ''}>"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        """Elements of the value, at the sizes it was traced (or specialized) at."""
        return math.prod(int(d) for d in self.shape or ())

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)


class Graph:
    """A traced function: ``inputs`` (placeholder nodes), ``outputs`` and ``effects`` (roots run for side effects)."""

    __slots__ = ("__dict__", "effects", "inputs", "outputs")

    def __init__(self, inputs: Iterable[Node], outputs: Iterable[Node], effects: Iterable[Node] = ()):
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.effects = tuple(effects)

    @functools.cached_property
    def order(self) -> tuple[Node, ...]:
        """All nodes reachable from outputs and effects, sources before users (iterative DFS, deterministic)."""
        return toposort(self.outputs + self.effects, self.inputs)

    def __repr__(self) -> str:
        return format_graph(self)


def toposort(roots: Iterable[Node], first: Iterable[Node] = (),
             deps: Callable[[Node], tuple[Node, ...]] | None = None) -> tuple[Node, ...]:
    """Post-order of the DAG under ``roots``; ``first`` (the inputs) are emitted first in their given order.
    ``deps``: what each node must come after, when not its sources (a rewrite that re-points a node elsewhere)."""
    seen: set[int] = set()
    out: list[Node] = []
    for n in first:
        if id(n) not in seen:
            seen.add(id(n))
            out.append(n)
    for root in roots:
        if id(root) in seen:
            continue
        stack: list[tuple[Node, int]] = [(root, 0)]
        while stack:
            node, i = stack.pop()
            srcs = node.srcs if deps is None else deps(node)
            if i < len(srcs):
                stack.append((node, i + 1))
                s = srcs[i]
                if id(s) not in seen:
                    stack.append((s, 0))
            elif id(node) not in seen:
                seen.add(id(node))
                out.append(node)
    return tuple(out)


def users(order: Iterable[Node]) -> dict[int, list[Node]]:
    """Map id(node) -> nodes that read it."""
    out: dict[int, list[Node]] = {}
    for n in order:
        for s in n.srcs:
            out.setdefault(id(s), []).append(n)
    return out
