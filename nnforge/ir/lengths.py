"""Which symbolic sizes are trip counts: the printer names them T, T1, ...; the C backend and specialization
keep them as run-time values. Needs only ops and dims, so the printer (which ``node`` imports) can use it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .dims import free_symbols
from .ops import Op

if TYPE_CHECKING:
    from .node import Graph


def loop_lengths(graph: Graph) -> list[tuple[object, ...]]:
    """Per scan or loop (nested bodies included), the sizes that are all its trip count: its length and the
    leading size of every sequence it walks (each a bare symbol, an expression of symbols, or a constant)."""
    out: list[tuple[object, ...]] = []
    for n in graph.order:
        if n.op in (Op.SCAN, Op.LOOP):
            sizes = [n.attrs["length"]]
            if n.op == Op.SCAN:
                nc, nx = n.attrs["n_carry"], n.attrs["n_xs"]
                sizes += [xs.shape[0] for xs in n.srcs[nc:nc + nx]]
            out.append(tuple(sizes))
            out += loop_lengths(n.attrs["body"])
    return out


def loop_length_symbols(graph: Graph) -> set[str]:
    """Symbols that decide a scan's or loop's trip count, in this graph or nested bodies: its length and its first
    sequence's leading size (another sequence's must equal it: a program checks it as the input's shape)."""
    return set().union(*(free_symbols(sizes[:2]) for sizes in loop_lengths(graph)))
