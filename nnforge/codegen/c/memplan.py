"""The C form of the workspace plan (``schedule.memory`` decides which buffers share a slot): a function computing
each slot's bytes at the call's sizes."""

from __future__ import annotations

from collections.abc import Sequence

from ...schedule.memory import Slot


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
