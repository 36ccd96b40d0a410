"""C spellings of dtypes, sizes and scalar op formulas: one row per elementwise op.

Sizes that set a loop's trip count stay symbolic (``S[k]``, read from the input shapes at run time) so one
shared object serves every sequence length; every other size is a literal the C compiler can unroll on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...dtypes import DType
from ...ir.dims import Dim, fold
from ...ir.expr import ONE, Expr, coefficient, depends, size_of
from ...ir.expr import size as size_expr
from ...ir.ops import Op
from ...schedule.target import Unsupported  # also raised by the C renderer: one class to catch

CTYPE = {DType.bool: "uint8_t", DType.int32: "int32_t", DType.int64: "int64_t", DType.float32: "float",
         DType.float64: "double"}


def ctype(dt: DType) -> str:
    if dt not in CTYPE:
        raise Unsupported(f"the C backend has no {dt.value} support (float16 and bfloat16 are GPU precisions)")
    return CTYPE[dt]


class Sizes:
    """Renders sizes as C: run-time symbols as ``S[k]``, ``local`` symbols as the C variables they name (a thread's
    row count in a row-split scan), all else as literals.

    A run-time size that is an expression of run-time symbols (a strided conv's output length,
    ``(T + 2p - k) // s + 1``, and everything derived from it) gets a slot of its own after the symbols, computed
    once per call by ``nf_sizes`` from the slots of its operands: kernels read ``S[k]``. Printed in every index
    instead, such expressions nested per layer and per use (143 copies in one file), and gcc spent minutes on
    them. Affine constants are gathered first (((T + 2) + 2) - 5 is T - 1), so equal sizes share a slot. The
    registry (``derived``) is shared by every copy made with ``with_local``."""

    def __init__(self, dynamic: Sequence[str], local: Mapping[str, str] | None = None,
                 derived: dict[tuple, tuple[int, str]] | None = None, local_sizes: Mapping[tuple, str] | None = None,
                 seeded: bool = False):
        self.dynamic = list(dynamic)
        self.seeded = seeded  # the entry after the symbols is the call's random seed (``Random`` kernels)
        self.slot = {name: k for k, name in enumerate(self.dynamic)}
        self.local = dict(local or {})
        self.local_sizes = dict(local_sizes or {})  # folded size expression -> the C variable that holds it here
        self.derived: dict[tuple, tuple[int, str]] = {} if derived is None else derived  # expr -> (slot, C)

    def with_local(self, name: str, cvar: str) -> Sizes:
        return Sizes(self.dynamic, {**self.local, name: cvar}, self.derived, self.local_sizes, self.seeded)

    def with_local_size(self, d: Dim, cvar: str) -> Sizes:
        """Sizes in which the run-time size ``d`` — a derived one, an expression of symbols — is the C variable
        ``cvar`` wherever it occurs (a chunk's step count for a sequence length computed from another)."""
        return Sizes(self.dynamic, self.local, self.derived, {**self.local_sizes, self._fold(d.expr): cvar},
                     self.seeded)

    @property
    def n_inputs(self) -> int:
        """Entries the caller passes: the run-time symbols' values, then the seed where there is one."""
        return len(self.dynamic) + self.seeded

    @property
    def n_slots(self) -> int:
        """Entries of the size array the kernels read: what the caller passes, then the derived sizes."""
        return self.n_inputs + len(self.derived)

    @property
    def seed(self) -> str:
        """The call's random seed as C."""
        assert self.seeded, "a program without Random kernels has no seed"
        return f"(uint64_t)S[{len(self.dynamic)}]"

    def definitions(self) -> list[str]:
        """C statements filling ``S[k]`` for the derived sizes, in dependency order (operands first)."""
        return [f"S[{k}] = {c};" for k, c in self.derived.values()]

    def __call__(self, d: int) -> str:
        if isinstance(d, Dim):
            return self._expr(d.expr, int(d))
        return str(int(d))

    def _expr(self, e: tuple, value: int) -> str:
        if not self._dynamic(e):
            return str(value)
        return self._r(self._fold(e))

    def _dynamic(self, e: tuple) -> bool:
        if e[0] == "sym":
            return e[1] in self.slot or e[1] in self.local
        if e[0] == "const":
            return False
        return self._dynamic(e[1]) or self._dynamic(e[2])

    def _local(self, e: tuple) -> bool:
        if e in self.local_sizes:
            return True
        if e[0] == "sym":
            return e[1] in self.local
        return e[0] != "const" and (self._local(e[1]) or self._local(e[2]))

    def _fold(self, e: tuple) -> tuple:
        """``e`` with static symbols as constants, constant operations evaluated and the constants of sums and
        differences gathered into one (``dims.fold``)."""
        return fold(e, lambda name: name in self.slot or name in self.local)

    def _r(self, e: tuple) -> str:
        if e in self.local_sizes:
            return self.local_sizes[e]
        if e[0] == "const":
            return str(e[1])
        if e[0] == "sym":
            if e[1] in self.local:
                return self.local[e[1]]
            return f"S[{self.slot[e[1]]}]" if e[1] in self.slot else str(e[2])
        a, b = self._r(e[1]), self._r(e[2])
        if e[0] == "floordiv":
            text = f"nf_floordiv({a}, {b})"
        elif e[0] == "mod":
            text = f"nf_mod({a}, {b})"
        else:
            text = f"({a} {dict(add='+', sub='-', mul='*')[e[0]]} {b})"
        if self._local(e):
            return text
        if e not in self.derived:
            self.derived[e] = (self.n_slots, text)
        return f"S[{self.derived[e][0]}]"

    def prod(self, shape: Sequence[int]) -> str:
        if not shape:
            return "1"
        if not any(isinstance(d, Dim) and self._dynamic(d.expr) for d in shape):
            return str(math.prod(int(d) for d in shape))
        return " * ".join(f"({self(d)})" for d in shape)

    def count(self, shape: Sequence[int]) -> Expr:
        """The number of elements of ``shape`` as an index expression (a row's, for a buffer's ``shape[1:]``)."""
        out = ONE
        for d in shape:
            out = out * self.expr(d)
        return out

    def is_static(self, d: int) -> bool:
        return not (isinstance(d, Dim) and self._dynamic(d.expr))

    def expr(self, d: int) -> Expr:
        """Size ``d`` as an index expression: a constant when it is static here (so it folds), else a size leaf."""
        return size_expr(int(d) if self.is_static(d) else d)

    def index(self, e: Expr) -> str:
        """An index expression as C. Its sizes print as sizes do; ``//`` and ``%`` as C's ``/`` and ``%``, which
        agree with floor division on the non-negative values an in-range index has. Parentheses as the kernels
        have always been spelled: a product's left operand unless it is a literal, a difference as ``((a) - b)``."""
        op, args = e.op, e.args
        if op == "const":
            return str(args[0])
        if op == "var":
            return args[0]
        if op == "size":
            return self(size_of(e))
        if op == "clamp":
            x, n = self.index(args[0]), self._atom(args[1])
            return f"({x} < 0 ? 0 : ({x} >= {n} ? {n} - 1 : {x}))"
        a, b = args
        if op == "add":
            if b.op == "const" and b.args[0] < 0:
                return f"{self.index(a)} - {-b.args[0]}"
            return f"{self.index(a)} + {self.index(b)}"
        if op == "sub":
            return f"(({self.index(a)}) - {self._atom(b)})"
        if op == "mul":
            left = self.index(a) if a.op == "const" and a.args[0] >= 0 else f"({self.index(a)})"
            return f"{left} * {self._atom(b)}"
        return f"({self.index(a)}) {'/' if op == 'floordiv' else '%'} ({self.index(b)})"

    def _atom(self, e: Expr) -> str:
        """``e`` as an operand that binds tighter than any binary operator."""
        text = self.index(e)
        if e.op in ("var", "size") or (e.op == "const" and e.args[0] >= 0):
            return text
        return f"({text})"




def _is_number(s: str) -> bool:
    return s.lstrip("-").isdigit()


def byte_size(*factors: int | str) -> str:
    """A product of sizes as C with its static factors multiplied out in Python: a static size is one number (the
    memory planner compares them; gcc never sees ``(1 * ((5 + 7) / 8) * 5 * 8) * sizeof(double)``), a run-time one
    carries one constant."""
    const, rest = 1, []
    for f in factors:
        s = str(f).strip()
        if _is_number(s):
            const *= int(s)
        else:
            rest.append(s if re.fullmatch(r"[\w\[\]]+(\(\))?", s) else f"({s})")
    if const == 0 or not rest:
        return str(const)
    return " * ".join(([str(const)] if const != 1 else []) + rest)


def ceil_div(a: int | str, b: int) -> int | str:
    """``ceil(a / b)`` for a size ``a >= 0``: a number when ``a`` is one, else the C expression."""
    s = str(a).strip()
    return -(-int(s) // b) if _is_number(s) else f"(({s}) + {b - 1}) / {b}"


def literal(value: object, dt: DType) -> str:
    if dt == DType.bool:
        return "1" if value else "0"
    if dt.is_int:
        return f"INT64_C({int(value)})" if dt == DType.int64 else str(int(value))
    v = float(value)
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    text = repr(v)
    return f"{text}f" if dt == DType.float32 else text


_MATH = {Op.EXP: "exp", Op.LOG: "log", Op.SQRT: "sqrt", Op.SIN: "sin", Op.COS: "cos", Op.TANH: "nf_tanh",
         Op.ERF: "erf", Op.LOG1P: "log1p", Op.EXPM1: "expm1"}
_INLINE_F32 = {Op.EXP: "nf_expf", Op.LOG: "nf_logf", Op.ERF: "nf_erff"}
"""float32 forms written in the prelude rather than libm's (inline: no call, no out-of-range path per element)."""


def formula(op: Op, dt: DType, src_dt: DType, args: Sequence[str], attrs: Mapping) -> str:
    """The C expression of one elementwise op on already-evaluated operands (plain variable names)."""
    f = "f" if dt == DType.float32 else ""
    a = args[0]
    b = args[1] if len(args) > 1 else ""
    fl = dt.is_float
    if op in _MATH:
        return f"{_INLINE_F32[op]}({a})" if f and op in _INLINE_F32 else f"{_MATH[op]}{f}({a})"
    if op == Op.NEG:
        return f"(-{a})"
    if op == Op.RECIP:
        return f"(({ctype(dt)})1 / {a})"
    if op == Op.SIGMOID:
        return f"nf_sigmoid{f}({a})"
    if op == Op.ABS:
        return f"fabs{f}({a})" if fl else (a if dt == DType.bool else f"({a} < 0 ? -{a} : {a})")
    if op == Op.SIGN:
        if fl:
            return f"({a} > 0 ? ({ctype(dt)})1 : ({a} < 0 ? ({ctype(dt)})-1 : ({a} == {a} ? {a} : 0)))"  # NaN -> 0
        return f"(({ctype(dt)})(({a} > 0) - ({a} < 0)))"
    if op == Op.ADD:
        return f"({a} + {b})" if dt != DType.bool else f"(uint8_t)({a} | {b})"
    if op == Op.SUB:
        return f"({a} - {b})"
    if op == Op.MUL:
        return f"({a} * {b})" if dt != DType.bool else f"(uint8_t)({a} & {b})"
    if op == Op.DIV:
        return f"({a} / {b})" if fl else f"nf_idiv_{ctype(dt)}({a}, {b})"
    if op == Op.POW:
        return f"pow{f}({a}, {b})" if fl else f"(({ctype(dt)})nf_ipow({a}, {b}))"
    if op == Op.MAX:
        return f"(({a} > {b} || {a} != {a}) ? {a} : {b})" if fl else f"({a} > {b} ? {a} : {b})"
    if op == Op.MIN:
        return f"(({a} < {b} || {a} != {a}) ? {a} : {b})" if fl else f"({a} < {b} ? {a} : {b})"
    if op in (Op.LT, Op.LE, Op.EQ, Op.NE):
        sym = {Op.LT: "<", Op.LE: "<=", Op.EQ: "==", Op.NE: "!="}[op]
        return f"(uint8_t)({a} {sym} {b})"
    if op == Op.WHERE:
        return f"({a} ? {b} : {args[2]})"
    if op == Op.CAST:
        if dt == DType.bool:
            return f"(uint8_t)({a} != 0)"
        return f"(({ctype(dt)}){a})"
    raise Unsupported(f"no C formula for {op.name.lower()}")


@dataclass(frozen=True)
class VectorSpelling:
    """How the prelude spells the elementwise vectors of one dtype: their type (``NF_VBYTES`` bytes, set per
    program) and the functions that load, store and broadcast them."""

    type: str
    load: str
    store: str
    broadcast: str


VECTORS = {DType.float32: VectorSpelling("nf_vf32", "nf_vld_f32", "nf_vst_f32", "nf_vbc_f32"),
           DType.bool: VectorSpelling("nf_vi32", "nf_vld_b", "nf_vst_b", "nf_vbc_b")}
"""The dtypes with elementwise vectors. A bool vector is a mask of 32-bit lanes (all ones or zero), lane for lane
with the float32 values it selects or compares, loaded from and stored to the bytes a bool buffer holds."""


def vector_lanes(vector_bytes: int) -> dict[DType, int]:
    """Elements per elementwise vector, per dtype with a vector form, in vectors of ``vector_bytes`` (the GEMM
    tiles' width: a fused tile's epilogue runs whole vectors of its columns). Every vector type has 32-bit lanes."""
    return dict.fromkeys(VECTORS, vector_bytes // 4)


_VECTOR = {Op.ADD: "({a} + {b})", Op.SUB: "({a} - {b})", Op.MUL: "({a} * {b})", Op.DIV: "({a} / {b})",
           Op.NEG: "(-{a})", Op.RECIP: "(1.0f / {a})", Op.SIGMOID: "nf_vsigmoidf({a})", Op.TANH: "nf_vtanhf({a})",
           Op.MAX: "nf_vmaxf({a}, {b})", Op.MIN: "nf_vminf({a}, {b})", Op.ABS: "nf_vabsf({a})",
           Op.SQRT: "nf_vsqrtf({a})", Op.EXP: "nf_vexpf({a})", Op.LOG: "nf_vlogf({a})",
           Op.ERF: "nf_verff({a})"}
_COMPARE = {Op.LT: "({a} < {b})", Op.LE: "({a} <= {b})", Op.EQ: "({a} == {b})", Op.NE: "({a} != {b})"}
_F32, _BOOL = DType.float32, DType.bool
_FORMS = {
    **{(op, _F32, (_F32,) * form.count("}")): form for op, form in _VECTOR.items()},
    (Op.WHERE, _F32, (_BOOL, _F32, _F32)): "nf_vsel_f32({a}, {b}, {c})",
    **{(op, _BOOL, (_F32, _F32)): form for op, form in _COMPARE.items()},
    # masks with masks: | and & are the IR's max and min of bools, ~ its == False
    (Op.MAX, _BOOL, (_BOOL, _BOOL)): "({a} | {b})", (Op.MIN, _BOOL, (_BOOL, _BOOL)): "({a} & {b})",
    (Op.EQ, _BOOL, (_BOOL, _BOOL)): "({a} == {b})", (Op.NE, _BOOL, (_BOOL, _BOOL)): "({a} != {b})",
}

VECTOR_OPS = frozenset(_FORMS)
"""(op, result dtype, operand dtypes) of the elementwise ops with a vector spelling (what the C target tells the
scheduler): float32 arithmetic, ``where`` on a mask, comparisons of float32 into a mask, logic of masks."""


def vector_formula(op: Op, dt: DType, src_dts: Sequence[DType], args: Sequence[str]) -> str:
    """The vector form of ``formula`` (operands are ``VECTORS`` of their dtypes); ``Unsupported`` for an op
    or dtypes without one, and the caller then keeps the scalar loop. Same results as the scalar forms: the
    arithmetic is the same IEEE operations, sigmoid and tanh the same polynomials (see the prelude), a comparison
    with NaN as false (``!=``: true) in both."""
    form = _FORMS.get((op, dt, tuple(src_dts)))
    if form is None:
        raise Unsupported(f"no vector form of {op.name.lower()} in {dt} of {[d.value for d in src_dts]}")
    return form.format(a=args[0], b=args[1] if len(args) > 1 else "", c=args[2] if len(args) > 2 else "")


def lane_stride(index: Expr, lane: str) -> int | None:
    """How the flat index ``index`` moves when the integer variable ``lane`` grows by one: 0 (it does not name
    ``lane``: the read may be hoisted out of the lane loop), 1 (consecutive elements: a vector load), or None
    (anything else: another stride, ``lane`` named but cancelling out, floor division or remainder of it).
    Judged on the expression (``coefficient``), not on its C text."""
    if not depends(index, lane):
        return 0
    return 1 if coefficient(index, lane) == ONE else None


def store(ptr: str, index: Expr, value: str, sz: Sizes, lanes: int = 1, lane: str = "",
          dt: DType = DType.float32) -> str:
    """The statement storing ``value`` at ``ptr[index]``; with ``lanes`` > 1 a vector of ``dt`` of that many
    consecutive elements from there (``Unsupported`` unless ``index`` moves by one with ``lane``)."""
    text = sz.index(index)
    if lanes == 1:
        return f"{ptr}[{text}] = {value};"
    if lane_stride(index, lane) != 1:
        raise Unsupported(f"{ptr}[{text}] is not contiguous in {lane}")
    return f"{VECTORS[dt].store}(&{ptr}[{text}], {value});"

PRELUDE = (Path(__file__).parent / "prelude.h").read_text()
"""Scalar helpers every program includes (kept in a .h file so it reads as C)."""
