"""The C side of row-split scans (the schedule decides which loops are split, ``Loop.parallel``): the code
around a split loop — each thread's rows, the row blocks the body runs on, pointer offsets, the prefetch of the
next step's input, and the copy-out at the end.

Inside the loop each thread runs the row-local body (its batch axis is the symbol ``ROWS``, rendered as the
thread's current row count) on its own rows, with no barrier until the loop ends; scratch buffers are allocated
for the whole batch and each thread uses its rows of them (``Lowering.alloc``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...ir.expr import Expr, var
from ...ir.node import Node
from ...passes.rows import RowSplit
from .cexpr import Sizes, ctype
from .emit import Emitter, Names


@dataclass(frozen=True)
class RowScope:
    """One thread's rows of a row-split scan: C variables for its first row and row count, the full batch, and
    the rows the body is run on now (``row``, ``count``: the thread's rows, or one block of ``block`` of them)."""

    r0: str
    nrow: str
    batch: int
    row: str
    count: str
    block: int
    temps: tuple[str, str, str, str]  # C names of the split's helper variables

    @staticmethod
    def new(names: Names, split: RowSplit, blk: int) -> RowScope:
        """One thread's rows of ``split``, the body run ``blk`` rows at a time (0: all at once). Every C name from
        ``names``, so identical layers' loops (one key, ``schedule.identical``) print the same C up to names."""
        r0, nrow = names.fresh("r0"), names.fresh("nrow")
        row, count = (names.fresh("row"), names.fresh("nb")) if blk else (r0, nrow)
        temps = (names.fresh("npair"), names.fresh("b0"), names.fresh("b1"), names.fresh("pf"))
        return RowScope(r0, nrow, split.batch, row, count, blk, temps)

    def note(self) -> str:
        """What the kernel listing says about the loop."""
        text = f", batch rows split among threads ({self.nrow} rows each, no barrier per step)"
        return text + (f", the body run {self.block} rows at a time" if self.block else "")

    def declare(self, em: Emitter, sz: Sizes) -> None:
        """Rows split as evenly as they go in pairs (64 rows: 32 and 32, each 5 micro-kernel blocks of 6 and one of 2
        run by the 2-row kernel), not in whole MR-row blocks (30 and 34: the second thread's 6 blocks set the pace
        of every step)."""
        n = sz(self.batch)
        npair, b0, b1, _ = self.temps
        em(f"const int64_t {npair} = ({n} + 1) / 2;",
           f"const int64_t {b0} = {npair} * nf_thread() / nf_team(), {b1} = {npair} * (nf_thread() + 1) / nf_team();",
           f"const int64_t {self.r0} = {b0} * 2 < {n} ? {b0} * 2 : {n};",
           f"const int64_t {self.nrow} = ({b1} * 2 < {n} ? {b1} * 2 : {n}) - {self.r0};")

    def thread_rows(self, ptr: str, shape: Sequence[int], sz: Sizes) -> str:
        """A [batch, ...] buffer at this thread's first row."""
        return f"{ptr} + {sz.index(var(self.r0) * sz.count(shape[1:]))}"

    def current_rows(self, ptr: str, shape: Sequence[int], sz: Sizes) -> str:
        """A [batch, ...] buffer at the first row the body runs on now."""
        return f"({ptr} + {sz.index(var(self.row) * sz.count(shape[1:]))})"

    def block_of_thread_rows(self, ptr: str, shape: Sequence[int], sz: Sizes) -> str:
        """A buffer already at this thread's rows (a carry), moved to the current row block."""
        if not self.block:
            return ptr
        return f"({ptr} + {sz.index((var(self.row) - var(self.r0)) * sz.count(shape[1:]))})"

    def open_block_loop(self, em: Emitter, rb: str) -> None:
        """``for`` over this thread's row blocks, defining the current rows (closed by the caller)."""
        em.open(f"for (int64_t {rb} = 0; {rb} < {self.nrow}; {rb} += {self.block}) {{")
        em(f"const int64_t {self.row} = {self.r0} + {rb};",
           f"const int64_t {self.count} = {self.nrow} - {rb} < {self.block} ? {self.nrow} - {rb} : {self.block};")

    def prefetch_next_step(self, em: Emitter, buf: str, x: Node, t: str, length: Expr, rev: bool,
                           sz: Sizes) -> None:
        """Touch this thread's rows of the next step's slice of a scanned input while this step computes: the
        slice (e.g. the hoisted input projection, [T, batch, 4H], far bigger than any cache) is read in column
        tiles with a row stride the hardware prefetcher does not follow, so without this every step starts with
        cache misses (measured: the premul loads took ~1/4 of an LSTM step's cell-update time at H = 96)."""
        nxt = length - 2 - var(t) if rev else var(t) + 1
        rest = sz.count(x.shape[2:])
        o = self.temps[3]
        at = nxt * sz.count(x.shape[1:]) + var(self.r0) * rest
        em(f"if ({t} + 1 < {sz.index(length)})",
           f"    for (int64_t {o} = 0; {o} < {sz.index(var(self.nrow) * rest)} * (int64_t)sizeof({ctype(x.dtype)}); "
           f"{o} += 64) __builtin_prefetch((const char*)({buf} + {sz.index(at)}) + {o});")

    def copy_out(self, em: Emitter, cur: str, result: str, shape: Sequence[int], i: str, sz: Sizes) -> None:
        """A carry's final value (at this thread's rows) into the scan's result: each thread its own rows."""
        rest = sz.count(shape[1:])
        em(f"for (int64_t {i} = 0; {i} < {sz.index(var(self.nrow) * rest)}; {i}++) "
           f"{result}[{sz.index(var(self.r0) * rest + var(i))}] = {cur}[{i}];")
