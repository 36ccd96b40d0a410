"""Cutting a program's top-level code into C functions, and emitting identical ones once.

Why: gcc's time grows with the size of the one OpenMP-outlined function that used to hold every kernel of a
program (a 5-layer LSTM stack: 3.3 s, nearly all of it per-function optimisation and RTL generation). Each
top-level kernel or scan becomes its own function, called in order from the single parallel region; its
``omp for`` / ``omp single`` constructs are orphaned, which binds them to that region exactly as before
(same barriers, same thread-private locals). Steps the schedule's records say are the same computation on other
buffers (``schedule.identical.step_keys``: the layers of a stack, forward and backward of repeated blocks) share
one function, compiled once and called with different pointers, the way a kernel cache reuses one kernel for
same-shaped work. The function is spelled from the part's C with its generated names renumbered and its buffers
and argument pointers turned into parameters (``canonical``).
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence

from ...errors import NNForgeError

# an argument pointer (with its cast, so the parameter gets the element type), or a name
_TOKEN = re.compile(r"\(\((\w+)\*\)args\[\d+\]\)|\bargs\[\d+\]|\b[A-Za-z_][A-Za-z_0-9]*\b")


def split_parts(body: list[str], marks: Sequence[int]) -> list[tuple[int, list[str]]]:
    """The top-level code cut at kernel / scan boundaries (``marks``: line indices after each top-level step) as
    (step, lines), the code after the last mark being step ``len(marks)`` (the copies into the results); empty
    parts are dropped."""
    parts: list[tuple[int, list[str]]] = []
    start = 0
    for step, m in enumerate([*marks, len(body)]):
        if m > start:
            parts.append((step, body[start:m]))
            start = m
    return parts


def canonical(part: list[str], buffers: dict[str, str], names: set[str]) -> tuple[str, list[tuple[str, str]]]:
    """``part`` with generated locals renamed ``z0, z1, ...`` and buffers / ``args[k]`` replaced by parameters
    ``p0, p1, ...`` in order of first use; returns (text, [(parameter C type, actual argument), ...])."""
    params: dict[str, str] = {}
    types: list[tuple[str, str]] = []
    local: dict[str, str] = {}

    def param(actual: str, ct: str) -> str:
        if actual not in params:
            params[actual] = f"p{len(params)}"
            types.append((ct, actual))
        return params[actual]

    def name(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok.startswith(("((", "args[")):
            return param(tok, f"{m.group(1)}*" if m.group(1) else "void*")
        if tok in buffers:
            return param(tok, buffers[tok] + "*")
        if tok in names:
            return local.setdefault(tok, f"z{len(local)}")
        return tok

    return _TOKEN.sub(name, "\n".join(part)), types


UNIT_MARK = "/*@nf_unit*/"
"""Starts a part of the source that may be compiled as its own translation unit (see ``toolchain``): what
precedes the first mark is the shared header, the part functions have external (hidden) linkage, and the last
unit holds their prototypes and ``nf_main``."""

PART_ATTRS = '__attribute__((noinline, visibility("hidden")))'


# Parameters are deliberately not ``restrict``: that would let gcc drop its run-time alias checks (a stack of
# five different widths then compiles in 1.65 s instead of 2.7 s) but the step kernel at H = 96 measured 5 %
# slower per core (32.1-32.4 vs 30.3-30.8 ms, 2026-11-22).


def part_functions(parts: Sequence[tuple[Hashable, list[str]]], buffers: Sequence[tuple[str, str]],
                   names: set[str]) -> tuple[list[str], list[str], list[str]]:
    """(calls in order, function definitions, prototypes) for (key, lines) parts: one function per distinct key,
    each definition preceded by ``UNIT_MARK``. Parts of one key must spell the same canonical C: a difference is
    a decision the renderer took that the records do not show, raised as such."""
    btypes = dict(buffers)
    fns: list[str] = []
    seen: dict[Hashable, tuple[str, str]] = {}
    calls: list[str] = []
    protos: list[str] = []
    for key, part in parts:
        text, params = canonical(part, btypes, names)
        fn, first = seen.get(key, (None, text))
        if first != text:
            raise NNForgeError(f"two steps with equal records printed different C ({fn}):\n{first}\n---\n{text}")
        if fn is None:
            fn = f"nf_part{len(seen)}"
            seen[key] = fn, text
            sig = ", ".join(["const int64_t* S", *(f"{ct} p{k}" for k, (ct, _) in enumerate(params))])
            protos.append(f"{PART_ATTRS} void {fn}({sig});")
            fns.append(UNIT_MARK)
            fns.append(f"{PART_ATTRS} void {fn}({sig}) {{")
            fns.append("    (void)S;")
            fns.append(text)
            fns.append("}")
        calls.append(f"{fn}({', '.join(['S', *(a for _, a in params)])});")
    return calls, fns, protos
