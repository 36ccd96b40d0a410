"""Flattening nested tuples/lists/dicts of leaves, for function arguments, scan carries and outputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Leaf = Any
TreeDef = Any  # ("leaf",) | ("none",) | ("tuple"|"list", children) | ("dict", keys, children)


def flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> tuple[list[Leaf], TreeDef]:
    """Leaves in a deterministic order (dicts by sorted key) and the structure to rebuild the tree."""
    leaves: list[Leaf] = []

    def go(t: Any) -> TreeDef:
        if is_leaf is not None and is_leaf(t):
            leaves.append(t)
            return ("leaf",)
        if t is None:
            return ("none",)
        if isinstance(t, tuple) and not hasattr(t, "_fields"):
            return ("tuple", tuple(go(c) for c in t))
        if isinstance(t, list):
            return ("list", tuple(go(c) for c in t))
        if isinstance(t, dict):
            keys = tuple(sorted(t))
            return ("dict", keys, tuple(go(t[k]) for k in keys))
        leaves.append(t)
        return ("leaf",)

    return leaves, go(tree)


def unflatten(treedef: TreeDef, leaves: list[Leaf]) -> Any:
    it = iter(leaves)

    def go(d: TreeDef) -> Any:
        kind = d[0]
        if kind == "leaf":
            return next(it)
        if kind == "none":
            return None
        if kind == "tuple":
            return tuple(go(c) for c in d[1])
        if kind == "list":
            return [go(c) for c in d[1]]
        return {k: go(c) for k, c in zip(d[1], d[2])}

    return go(treedef)


def describe(treedef: TreeDef) -> str:
    """Readable structure for error messages, e.g. ``(*, *)`` or ``{'h': *, 'c': *}``."""
    kind = treedef[0]
    if kind == "leaf":
        return "*"
    if kind == "none":
        return "None"
    if kind == "tuple":
        inner = ", ".join(describe(c) for c in treedef[1])
        return f"({inner}{',' if len(treedef[1]) == 1 else ''})"
    if kind == "list":
        return "[" + ", ".join(describe(c) for c in treedef[1]) + "]"
    return "{" + ", ".join(f"{k!r}: {describe(c)}" for k, c in zip(treedef[1], treedef[2])) + "}"
