"""Flattening nested tuples, namedtuples, lists and dicts of leaves: function arguments, scan carries, outputs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Leaf = Any
TreeDef = Any  # ("leaf",) | ("none",) | ("tuple"|"list", children) | ("dict", keys, children)
#                 | ("namedtuple", type, children)


def flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> tuple[list[Leaf], TreeDef]:
    """Leaves in a deterministic order (dicts by sorted key) and the structure to rebuild the tree."""
    leaves: list[Leaf] = []
    return leaves, _walk(tree, is_leaf, leaves)


def flatten_call(args: tuple, kwargs: dict, is_leaf: Callable[[Any], bool]) -> tuple[list[Leaf], TreeDef]:
    """``flatten((args, kwargs), is_leaf)``: a call's arguments. Positional leaves alone, the common call, skip
    the walk (a compiled function's short call pays for every step of it)."""
    if not kwargs and all(map(is_leaf, args)) and not any(map(is_leaf, (args, kwargs))):
        return list(args), ("tuple", (("tuple", (_LEAF,) * len(args)), _NO_KWARGS))
    return flatten((args, kwargs), is_leaf)


_LEAF, _NO_KWARGS = ("leaf",), ("dict", (), ())


def _walk(t: Any, is_leaf: Callable[[Any], bool] | None, leaves: list[Leaf]) -> TreeDef:
    """Module-level (see ``_build``): a nested recursive closure would keep ``leaves`` alive in a cycle."""
    if is_leaf is not None and is_leaf(t):
        leaves.append(t)
        return ("leaf",)
    if t is None:
        return ("none",)
    if _is_namedtuple(t):  # a node, rebuilt as its own type: stacking its fields would lose them (``p.a``)
        return ("namedtuple", type(t), tuple(_walk(c, is_leaf, leaves) for c in t))
    if isinstance(t, tuple):
        return ("tuple", tuple(_walk(c, is_leaf, leaves) for c in t))
    if isinstance(t, list):
        return ("list", tuple(_walk(c, is_leaf, leaves) for c in t))
    if isinstance(t, dict):
        keys = tuple(sorted(t))
        return ("dict", keys, tuple(_walk(t[k], is_leaf, leaves) for k in keys))
    leaves.append(t)
    return ("leaf",)


def _is_namedtuple(t: Any) -> bool:
    """A ``collections.namedtuple`` / ``typing.NamedTuple`` instance: a tuple whose type names its fields and can
    be rebuilt from them (``_make``)."""
    return isinstance(t, tuple) and hasattr(type(t), "_fields") and hasattr(type(t), "_make")


def unflatten(treedef: TreeDef, leaves: list[Leaf]) -> Any:
    return _build(treedef, iter(leaves))


def _build(d: TreeDef, it: Iterator[Leaf]) -> Any:
    """A module-level function, not a nested recursive closure: that closure would be a reference cycle holding
    the leaves (a compiled call's outputs) until the cyclic garbage collector runs."""
    kind = d[0]
    if kind == "leaf":
        return next(it)
    if kind == "none":
        return None
    if kind == "tuple":
        return tuple(_build(c, it) for c in d[1])
    if kind == "list":
        return [_build(c, it) for c in d[1]]
    if kind == "namedtuple":
        return d[1]._make([_build(c, it) for c in d[2]])
    return {k: _build(c, it) for k, c in zip(d[1], d[2])}


def leaf_paths(treedef: TreeDef, root: str = "") -> list[str]:
    """Each leaf's place in the tree as Python indexes it (``[1][0]``, ``['h0']``), in ``flatten``'s order."""
    kind = treedef[0]
    if kind == "leaf":
        return [root]
    if kind == "none":
        return []
    if kind == "namedtuple":
        return [path for k, c in zip(treedef[1]._fields, treedef[2]) for path in leaf_paths(c, f"{root}.{k}")]
    keys = range(len(treedef[1])) if kind in ("tuple", "list") else treedef[1]
    children = treedef[1] if kind in ("tuple", "list") else treedef[2]
    return [path for k, c in zip(keys, children) for path in leaf_paths(c, f"{root}[{k!r}]")]


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
    if kind == "namedtuple":
        inner = ", ".join(f"{k}={describe(c)}" for k, c in zip(treedef[1]._fields, treedef[2]))
        return f"{treedef[1].__name__}({inner})"
    return "{" + ", ".join(f"{k!r}: {describe(c)}" for k, c in zip(treedef[1], treedef[2])) + "}"
