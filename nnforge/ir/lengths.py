"""Which symbolic sizes are trip counts: the printer names them T, T1, ...; the C backend and specialization
keep them as run-time values. Needs only ops and dims, so the printer (which ``node`` imports) can use it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .dims import free_symbols
from .ops import Op

if TYPE_CHECKING:
    from .node import Graph


def loop_length_groups(graph: Graph) -> list[set[str]]:
    """The symbols each scan or loop (nested bodies included) takes its trip count from: its length and the
    leading size of every sequence it walks, which must all be one size — one group per loop."""
    groups: list[set[str]] = []
    for n in graph.order:
        if n.op in (Op.SCAN, Op.LOOP):
            group = set(free_symbols(n.attrs["length"]))
            if n.op == Op.SCAN:
                nc = n.attrs["n_carry"]
                for xs in n.srcs[nc:nc + n.attrs["n_xs"]]:
                    group |= free_symbols(xs.shape[0])
            groups.append(group)
            groups += loop_length_groups(n.attrs["body"])
    return groups


def loop_length_symbols(graph: Graph) -> set[str]:
    """Symbols that decide a scan's or loop's trip count, in this graph or nested bodies: its length and its first
    sequence's leading size (another sequence's must equal it: a program checks it as the input's shape)."""
    out: set[str] = set()
    for n in graph.order:
        if n.op in (Op.SCAN, Op.LOOP):
            out |= free_symbols(n.attrs["length"])
            if n.op == Op.SCAN and n.attrs["n_xs"]:
                out |= free_symbols(n.srcs[n.attrs["n_carry"]].shape[0])
            out |= loop_length_symbols(n.attrs["body"])
    return out
