"""Building nodes: runs the op's shape rule and attaches the user's source line to any error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import NNForgeError, user_location
from .node import Node
from .ops import Op
from .registry import SHAPE_RULES


def make(op: Op, srcs: tuple[Node, ...] = (), attrs: Mapping[str, Any] | None = None,
         types: tuple | None = None, loc: str | None = None) -> Node:
    """A new node of ``op``; shape and dtype come from the op's rule. Errors name the user's file:line."""
    attrs = attrs or {}
    loc = loc if loc is not None else user_location()
    try:
        shape, dtype = SHAPE_RULES[op](op, srcs, attrs)
    except NNForgeError as e:
        raise type(e)(f"{e} (at {loc})") from None
    return Node(op, tuple(srcs), attrs, shape, dtype, loc, types)


def rebuild(node: Node, srcs: tuple[Node, ...], attrs: Mapping[str, Any] | None = None,
            types: tuple | None = None) -> Node:
    """``node`` with new sources (and optionally attrs): how passes and specialization make their copies."""
    return make(node.op, srcs, node.attrs if attrs is None else attrs,
                node.types if types is None else types, loc=node.loc)
