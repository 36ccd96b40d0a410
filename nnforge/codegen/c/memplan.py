"""Memory planning: workspace buffers whose lifetimes do not overlap share memory.

Every scratch buffer of a program lives in one workspace the caller owns (``nf_workspace`` says how big). A
buffer is live from the first to the last top-level part (kernel or scan, in program order) that names it; all
threads leave a part through its closing barrier before the next part starts, so two buffers never live in the
same part may occupy the same bytes. Buffers are grouped into slots (interval colouring, in order of first use;
each buffer joins the free slot closest to its size) and a slot is as big as its largest member. Sizes may be
run-time expressions (a scan's T): the slot size is then the C maximum of its members, computed per call by one
function (``slot_bytes_function``), so one plan holds for every sequence length.

Why: a training step keeps many [T, N, H] intermediates (gates, their derivatives, stacked per-step values) whose
lifetimes are short; without reuse the workspace of an LSTM step at T = 2000 is several hundred MB.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Slot:
    """Bytes shared by buffers with disjoint lifetimes: its members' size expressions and the parts it is busy
    until."""

    sizes: list[str] = field(default_factory=list)
    busy_until: int = -1

    def members(self) -> tuple[int | None, list[str]]:
        """(the largest static member or None, the distinct run-time members in order of joining)."""
        numbers = [int(s) for s in self.sizes if s.isdigit()]
        return (max(numbers) if numbers else None), list(dict.fromkeys(s for s in self.sizes if not s.isdigit()))


def slot_bytes_function(slots: Sequence[Slot], name: str = "nf_slot_bytes") -> list[str]:
    """C of ``static void name(const int64_t* S, int64_t* b)`` setting ``b[k]`` to slot k's bytes.

    Every distinct run-time size is computed once, into a local, and a slot takes the largest of its members
    through ``nf_max64`` (a function: each argument is evaluated once). The text then grows with the number of
    buffers; a macro maximum nested per member doubled it at every level (gcc ran out of memory on a 24-layer
    MLP)."""
    local: dict[str, str] = {}
    lines = [f"static void {name}(const int64_t* S, int64_t* b) {{", "    (void)S;"]
    for slot in slots:
        for expr in slot.members()[1]:
            if expr not in local:
                local[expr] = f"z{len(local)}"
                lines.append(f"    const int64_t {local[expr]} = {expr};")
    for k, slot in enumerate(slots):
        static, dynamic = slot.members()
        terms = ([str(static)] if static is not None else []) + [local[e] for e in dynamic]
        value = terms[0]
        for t in terms[1:]:
            value = f"nf_max64({value}, {t})"
        lines.append(f"    b[{k}] = {value};")
    lines.append("}")
    return lines


def lifetimes(parts: Sequence[Sequence[str]], names: Sequence[str]) -> dict[str, tuple[int, int]]:
    """(first, last) part index naming each buffer; a buffer no part names gets (0, len(parts))."""
    found: dict[str, list[int]] = {n: [] for n in names}
    token = re.compile(r"\b[A-Za-z_][A-Za-z_0-9]*\b")
    for k, part in enumerate(parts):
        for tok in set(token.findall("\n".join(part))):
            if tok in found:
                found[tok].append(k)
    return {n: (min(ks), max(ks)) if ks else (0, len(parts)) for n, ks in found.items()}


def plan(parts: Sequence[Sequence[str]], allocs: Sequence[tuple[str, str, str]]) -> tuple[list[Slot], list[int]]:
    """Slots and each alloc's slot index. ``allocs`` are (name, C type, byte-size expression)."""
    life = lifetimes(parts, [a[0] for a in allocs])
    slots: list[Slot] = []
    where = [0] * len(allocs)
    order = sorted(range(len(allocs)), key=lambda i: (life[allocs[i][0]][0], i))
    for i in order:
        first, last = life[allocs[i][0]]
        size = allocs[i][2]
        free = [k for k, s in enumerate(slots) if s.busy_until < first]
        k = min(free, key=lambda k: _misfit(slots[k], size)) if free else None
        if k is None:
            slots.append(Slot())
            k = len(slots) - 1
        slots[k].sizes.append(size)
        slots[k].busy_until = last
        where[i] = k
    return slots, where


def _misfit(slot: Slot, size: str) -> tuple[int, int]:
    """How badly a buffer of ``size`` fits a slot: exact static matches first, then the closest static size;
    run-time sizes prefer a slot already holding the same expression."""
    if size in slot.sizes:
        return (0, 0)
    if size.isdigit() and all(s.isdigit() for s in slot.sizes):
        return (1, abs(max(int(s) for s in slot.sizes) - int(size)))
    return (2, 0)
