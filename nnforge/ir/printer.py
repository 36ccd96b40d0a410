"""Deterministic text form of a graph: SSA lines with dtypes and shapes, loop bodies nested.

Numbering follows the topological order, so the same program always prints the same text; tests compare
this text before and after a pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .dims import Dim, free_symbols, symbol_name
from .dims import render as render_size
from .lengths import loop_length_symbols
from .ops import Op

if TYPE_CHECKING:  # node imports this module for Graph.__repr__
    from .node import Graph, Node


def render(d: int, names: dict[str, str] | None = None) -> str:
    """A size as printed: a loop-length symbol by its name (T, T1, ...), a size computed from them as that
    expression (``T*64``, ``((T+18)//5)+1``: it changes with T, so its value at trace time would mislead), anything
    else by its value."""
    if names and symbol_name(d) in names:
        return names[symbol_name(d)]
    if names and isinstance(d, Dim) and free_symbols(d) & names.keys():
        return render_size(d, lambda name, value: names.get(name, str(value)))
    return str(int(d))


def fmt_type(shape: tuple | None, dtype: Any, names: dict[str, str] | None = None) -> str:
    if shape is None:
        return "()"
    return f"{dtype.short}[{', '.join(render(d, names) for d in shape)}]"


def _fmt_attr(key: str, value: Any, names: dict[str, str]) -> str | None:
    if key in ("body", "primal"):
        return None
    if key == "fn":
        return f"fn={getattr(value, '__qualname__', type(value).__name__)}"
    if isinstance(value, np.ndarray):
        if value.size <= 4:
            return f"{key}={np.array2string(value.ravel(), precision=4, separator=',')}"
        return f"{key}=<{value.size} values>"
    if isinstance(value, Dim):
        return f"{key}={render(value, names)}"
    if isinstance(value, tuple):
        inner = ", ".join(render(v, names) if isinstance(v, int) and not isinstance(v, bool) else repr(v)
                          for v in value)
        return f"{key}=({inner})"
    if key in ("shape", "dtype"):
        return None
    return f"{key}={value!r}" if not isinstance(value, float) else f"{key}={value:.6g}"


def format_graph(graph: Graph, indent: str = "", name: str = "graph", sizes: dict[str, str] | None = None) -> str:
    if sizes is None:
        syms = sorted(loop_length_symbols(graph))
        sizes = {s: "T" if i == 0 else f"T{i}" for i, s in enumerate(syms)}
    names: dict[int, str] = {}
    lines: list[str] = []
    for i, n in enumerate(graph.inputs):
        names[id(n)] = f"%{i}"
    head = ", ".join(f"%{i}: {fmt_type(n.shape, n.dtype, sizes)}" for i, n in enumerate(graph.inputs))
    lines.append(f"{indent}{name}({head}) {{")
    counter = len(graph.inputs)
    for n in graph.order:
        if id(n) in names:
            continue
        ref = f"%{counter}"
        counter += 1
        names[id(n)] = ref
        args = ", ".join(names[id(s)] for s in n.srcs)
        attrs = [a for a in (_fmt_attr(k, v, sizes) for k, v in sorted(n.attrs.items())) if a]
        if n.op == Op.INPUT:
            attrs = [f"name={n.attrs['name']!r}"]
        if n.op == Op.CONST:
            attrs = [f"value={n.attrs['value']!r}"]
        if n.types is not None:
            ty = "(" + ", ".join(fmt_type(s, d, sizes) for s, d in n.types) + ")"
        else:
            ty = fmt_type(n.shape, n.dtype, sizes)
        text = f"{indent}  {ref} = {n.op.name.lower()}({args})"
        if attrs:
            text += " " + " ".join(attrs)
        text += f" : {ty}"
        body = n.attrs.get("body")
        if body is not None:
            lines.append(text + " {")
            lines.append(format_graph(body, indent + "    ", "body", sizes))
            lines.append(f"{indent}  }}")
        else:
            lines.append(text)
    outs = ", ".join(names[id(n)] for n in graph.outputs)
    effects = ", ".join(names[id(n)] for n in graph.effects)
    lines.append(f"{indent}  return {outs}" + (f" effects {effects}" if effects else ""))
    lines.append(f"{indent}}}")
    return "\n".join(lines)


def node_name(node: Node) -> str:
    return f"{node.op.name.lower()}{fmt_type(node.shape, node.dtype) if node.types is None else ''}"
