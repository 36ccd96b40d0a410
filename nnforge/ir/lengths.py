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
    return _groups(graph, every_sequence=True)


def loop_length_symbols(graph: Graph) -> set[str]:
    """Symbols that decide a scan's or loop's trip count, in this graph or nested bodies: its length and its first
    sequence's leading size (another sequence's must equal it: a program checks it as the input's shape)."""
    return set().union(*_groups(graph, every_sequence=False))


def _groups(graph: Graph, every_sequence: bool) -> list[set[str]]:
    groups: list[set[str]] = []
    for n in graph.order:
        if n.op in (Op.SCAN, Op.LOOP):
            group = set(free_symbols(n.attrs["length"]))
            if n.op == Op.SCAN:
                nc, nx = n.attrs["n_carry"], n.attrs["n_xs"]
                for xs in n.srcs[nc:nc + (nx if every_sequence else min(nx, 1))]:
                    group |= free_symbols(xs.shape[0])
            groups.append(group)
            groups += _groups(n.attrs["body"], every_sequence)
    return groups
