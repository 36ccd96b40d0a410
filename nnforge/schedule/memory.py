"""The workspace plan: which scratch buffers may share bytes, from lifetimes read off the program's records.

Every scratch buffer of a program lives in one workspace the caller owns and reuses across calls. A top-level
*step* is a kernel or loop of the program's block, in order (the copies into the results after them count as one
more); a workspace buffer is live from the step that writes it first to the last step that reads it, and all
workers leave a step before the next one starts, so buffers never live in the same step may occupy the same
bytes. Buffers a backend allocates for its own use inside one step (packed GEMM panels, a loop's carries and its
body's scratch) live in that step only.

Buffers are grouped into slots (interval colouring in order of first use; each joins the free slot closest to its
size) and a slot is as big as its largest member. A size is a number of bytes or, for a run-time size, an opaque
key the backend prints (equal keys are equal sizes): the slot then takes the maximum of its members at run time,
so one plan holds for every sequence length.

Why: a training step keeps many [T, N, H] intermediates (gates, their derivatives, stacked per-step values) whose
lifetimes are short; without reuse the workspace of an LSTM step at T = 2000 is several hundred MB.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..ir.node import Node
from ..ir.ops import Op
from ..passes.fuse import Grouping
from .program import Block, Kernel, Loop, Program, SlicedGemm, stored_node

Size = int | str
"""Bytes: a number, or a run-time size's key (a string of digits also counts as a number)."""


@dataclass
class Slot:
    """Bytes shared by buffers with disjoint lifetimes: its members' sizes and the last step it is busy in."""

    sizes: list[Size] = field(default_factory=list)
    busy_until: int = -1

    def members(self) -> tuple[int | None, list[str]]:
        """(the largest static member or None, the distinct run-time members in order of joining)."""
        numbers = [int(s) for s in self.sizes if _static(s)]
        dynamic = [str(s) for s in self.sizes if not _static(s)]
        return (max(numbers) if numbers else None), list(dict.fromkeys(dynamic))


def plan(lives: Sequence[tuple[int, int]], sizes: Sequence[Size]) -> tuple[list[Slot], list[int]]:
    """Slots, and each buffer's slot index, for buffers live over steps ``lives[i]`` (first, last) of
    ``sizes[i]`` bytes."""
    slots: list[Slot] = []
    where = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (lives[i][0], i)):
        first, last = lives[i]
        free = [k for k, s in enumerate(slots) if s.busy_until < first]
        k = min(free, key=lambda k: _misfit(slots[k], sizes[i])) if free else None
        if k is None:
            slots.append(Slot())
            k = len(slots) - 1
        slots[k].sizes.append(sizes[i])
        slots[k].busy_until = last
        where[i] = k
    return slots, where


def lifetimes(program: Program) -> dict[str, tuple[int, int]]:
    """(first, last) top-level step of every scratch buffer the program's block names (by ``Buf.name``): written
    by its kernel's step, read by the steps whose kernels read its value (through views and inlined values)."""
    block = program.block
    g = block.grouping
    buf_of: dict[int, str] = {}  # id(node with a scratch buffer) -> its buffer's name
    life: dict[str, tuple[int, int]] = {}
    for step, k in enumerate(block.kernels):
        for node, buf in _written(k, block):
            if buf.output is None:
                buf_of[id(node)] = buf.name
                life[buf.name] = (step, step)
        if isinstance(k, Loop):
            for c in k.chunked:  # the chunk buffer lives in its loop
                life[c.gemm.out.name] = (step, step)
    steps = [_read_roots(k) for k in block.kernels]
    if block.copies:
        steps.append((tuple(c.node for c in block.copies), ()))
    for step, roots in enumerate(steps):
        for n in _buffers_read(roots, g):
            name = buf_of.get(id(n))
            if name is not None:
                first, last = life[name]
                life[name] = (first, max(last, step))
    return life


def _written(k: Kernel | Loop, block: Block) -> list[tuple[Node, object]]:
    """(node, its buffer) for what a top-level step stores."""
    if isinstance(k, Loop):
        projs = {m.attrs["index"]: m for m in block.graph.order if m.op == Op.PROJ and m.srcs[0] is k.node}
        return [(projs[i], b) for i, b in enumerate(k.results) if i in projs]
    if isinstance(k, SlicedGemm):
        product = [(k.returned, k.product)] if k.product is not None else []
        return [*zip(k.group.members, k.outs), *product]
    return [(stored_node(k), k.out)]


def _read_roots(k: Kernel | Loop) -> tuple[tuple[Node, ...], tuple[Node, ...]]:
    """(the values a step reads, the nodes it computes itself): a loop reads its sources and what its chunked
    projections read — their operands and their epilogues' other operands (an epilogue adding a buffer computed
    before the loop: it must outlive the loop); a kernel the sources of what it computes."""
    if isinstance(k, Loop):
        chunks = [(c.gemm.node, stored_node(c.gemm)) for c in k.chunked]
        own = tuple(n for pair in chunks for n in pair)
        return (*k.node.srcs, *(s for n in own for s in n.srcs)), own
    own = (k.group.gemm, k.group.root, *k.group.members) if isinstance(k, SlicedGemm) else (k.node, stored_node(k))
    return tuple(s for n in own for s in n.srcs), own


def _buffers_read(start: tuple[tuple[Node, ...], tuple[Node, ...]], g: Grouping) -> list[Node]:
    """The nodes with buffers a step reads: its values, through everything evaluated inline (views, fused and
    recomputed values); a view read as a buffer (an alias) is its source's buffer."""
    values, own = start
    found: list[Node] = []
    seen: set[int] = {id(n) for n in own}
    stack = list(values)
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if id(n) in g.alias:
            stack.append(n.srcs[0])
        elif id(n) in g.stored and id(n) not in g.epilogue_of:
            found.append(n)
        else:
            stack.extend(n.srcs)
    return found


def _static(size: Size) -> bool:
    return isinstance(size, int) or size.isdigit()


def _misfit(slot: Slot, size: Size) -> tuple[int, int]:
    """How badly a buffer of ``size`` fits a slot: exact matches first, then the closest static size; run-time
    sizes prefer a slot already holding the same expression."""
    if size in slot.sizes:
        return (0, 0)
    if _static(size) and all(_static(s) for s in slot.sizes):
        return (1, abs(max(int(s) for s in slot.sizes) - int(size)))
    return (2, 0)
