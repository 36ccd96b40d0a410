"""Integer index expressions as data: what a kernel reads and writes, before any backend spells it.

Leaves are constants, index variables (a loop index or a backend temporary: no value, only a name) and sizes
(``int`` or ``Dim``, printed by the backend's size printer). The operators simplify as they build (constants
folded, ``x * 1``, ``x + 0``, ``x // 1``, constants of sums and products gathered), so printed code stays as small
as hand-built strings; ``Expr(op, args)`` builds a node as is. Analyses (which way an index moves with a loop
variable) walk the tree instead of parsing generated text. ``//`` and ``%`` are floor division and its remainder,
as Python and the C prelude's ``nf_floordiv`` / ``nf_mod`` define them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .dims import SIZE_OPS, Dim

_LEAVES = ("const", "var", "size")
_BINARY = ("add", "sub", "mul", "floordiv", "mod")


class Expr:
    """One node: ``("const", c)``, ``("var", name)``, ``("size", dim_expr, value)``, a binary op on two Exprs, or
    ``("clamp", x, n)`` (``x`` clamped into ``0 .. n - 1``). Immutable, compared and hashed by structure."""

    __slots__ = ("_hash", "args", "op")

    def __init__(self, op: str, args: tuple) -> None:
        self.op, self.args = op, args
        self._hash = hash((op, args))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, o: object) -> bool:
        return isinstance(o, Expr) and self._hash == o._hash and self.op == o.op and self.args == o.args

    def __repr__(self) -> str:
        return f"Expr{(self.op, *self.args)!r}"

    @property
    def value(self) -> int | None:
        """The constant, or None for anything else."""
        return self.args[0] if self.op == "const" else None

    def __add__(self, o: Expr | int) -> Expr:
        return add(self, as_expr(o))

    def __radd__(self, o: int) -> Expr:
        return add(as_expr(o), self)

    def __sub__(self, o: Expr | int) -> Expr:
        return sub(self, as_expr(o))

    def __mul__(self, o: Expr | int) -> Expr:
        return mul(self, as_expr(o))

    def __rmul__(self, o: int) -> Expr:
        return mul(as_expr(o), self)

    def __floordiv__(self, o: Expr | int) -> Expr:
        return floordiv(self, as_expr(o))

    def __mod__(self, o: Expr | int) -> Expr:
        return mod(self, as_expr(o))


def const(c: int) -> Expr:
    return Expr("const", (int(c),))


def var(name: str) -> Expr:
    """An index variable: a loop index, or a backend temporary holding an integer (a clamped gather index)."""
    return Expr("var", (name,))


def size(d: int) -> Expr:
    """A size: a constant for a plain int, a ``size`` leaf for a ``Dim`` (its symbol may be a run-time size)."""
    if isinstance(d, Dim):
        return Expr("size", (d.expr, int(d)))
    return const(d)


def as_expr(x: Expr | int) -> Expr:
    return x if isinstance(x, Expr) else size(x)


def size_of(e: Expr) -> int:
    """The ``int`` or ``Dim`` a ``size`` leaf stands for."""
    expr, value = e.args
    return value if expr[0] == "const" else Dim(value, expr)


ZERO, ONE = const(0), const(1)


def _split_const(e: Expr) -> tuple[int, Expr | None]:
    """(c, x) with e = c + x: the constant of a constant or of a sum with one constant operand (x None: none)."""
    if e.op == "const":
        return e.args[0], None
    if e.op == "add":
        a, b = e.args
        if a.op == "const":
            return a.args[0], b
        if b.op == "const":
            return b.args[0], a
    return 0, e


def add(a: Expr, b: Expr) -> Expr:
    """``a + b``; the constants of ``c1 + (c2 + x)`` and ``(x + c1) + c2`` gathered (a slice of a slice reads
    ``start1 + start2 + i``)."""
    if a.op == "const" and b.op == "const":
        return const(a.args[0] + b.args[0])
    if a == ZERO:
        return b
    if b == ZERO:
        return a
    if a.op == "const" and b.op == "add" and b.args[0].op == "const":
        return add(const(a.args[0] + b.args[0].args[0]), b.args[1])
    if b.op == "const" and a.op == "add" and a.args[1].op == "const":
        return add(a.args[0], const(a.args[1].args[0] + b.args[0]))
    return Expr("add", (a, b))


def sub(a: Expr, b: Expr) -> Expr:
    if a.op == "const" and b.op == "const":
        return const(a.args[0] - b.args[0])
    if b == ZERO:
        return a
    return Expr("sub", (a, b))


def mul(a: Expr, b: Expr) -> Expr:
    """``a * b``; a constant factor of a product gathered with another (``4 * (8 * x)`` is ``32 * x``)."""
    if a.op == "const" and b.op == "const":
        return const(a.args[0] * b.args[0])
    if a == ZERO or b == ZERO:
        return ZERO
    if a == ONE:
        return b
    if b == ONE:
        return a
    for c, x in ((a, b), (b, a)):
        if c.op == "const" and x.op == "mul" and x.args[0].op == "const":
            return mul(const(c.args[0] * x.args[0].args[0]), x.args[1])
    return Expr("mul", (a, b))


def floordiv(a: Expr, b: Expr) -> Expr:
    if a.op == "const" and b.op == "const":
        return const(a.args[0] // b.args[0])
    if b == ONE:
        return a
    return Expr("floordiv", (a, b))


def mod(a: Expr, b: Expr) -> Expr:
    if a.op == "const" and b.op == "const":
        return const(a.args[0] % b.args[0])
    if b == ONE:
        return ZERO
    return Expr("mod", (a, b))


def clamp(x: Expr, n: Expr) -> Expr:
    """``x`` clamped into ``0 .. n - 1`` (the index a padded or concatenated read loads at, in range or not)."""
    return Expr("clamp", (x, n))


def row_major(idx: Sequence[Expr], shape: Sequence[Expr]) -> Expr:
    """The offset of ``idx`` in a contiguous buffer of ``shape``, in Horner form ``((i) * d1 + j) * d2 + k`` built
    as is (not simplified: the C kernels have always been spelled so, and the compiler folds ``* 1`` itself)."""
    if not idx:
        return ZERO
    out = idx[0]
    for i, d in zip(idx[1:], shape[1:]):
        out = i if out == ZERO else Expr("add", (Expr("mul", (out, d)), i))
    return out


def contiguous_strides(shape: Sequence[Expr]) -> list[Expr]:
    """Row-major strides of ``shape`` (the last axis 1)."""
    out, acc = [], ONE
    for d in reversed(shape):
        out.append(acc)
        acc = mul(acc, d)
    return out[::-1]


def evaluate(e: Expr, env: Mapping[str, int]) -> int:
    """The value of ``e`` with its variables from ``env`` and its sizes at their current values."""
    op, args = e.op, e.args
    if op == "const":
        return args[0]
    if op == "var":
        return env[args[0]]
    if op == "size":
        return args[1]
    if op == "clamp":
        x, n = evaluate(args[0], env), evaluate(args[1], env)
        return 0 if x < 0 else n - 1 if x >= n else x
    return SIZE_OPS[op](evaluate(args[0], env), evaluate(args[1], env))


def replace_var(e: Expr, name: str, value: Expr) -> Expr:
    """``e`` with the variable ``name`` replaced by ``value``, simplified as it is rebuilt (``i - 1`` at ``i = 0``
    is the constant ``-1``)."""
    if e.op == "var":
        return value if e.args[0] == name else e
    if e.op in ("const", "size"):
        return e
    a, b = (replace_var(x, name, value) for x in e.args)
    return clamp(a, b) if e.op == "clamp" else _BUILD[e.op](a, b)


def depends(e: Expr, name: str) -> bool:
    """Whether ``e`` names the variable ``name``."""
    if e.op == "var":
        return e.args[0] == name
    if e.op in ("const", "size"):
        return False
    return depends(e.args[0], name) or depends(e.args[1], name)


def coefficient(e: Expr, name: str) -> Expr | None:
    """How much ``e`` grows when the variable ``name`` grows by one, if ``e`` is linear in it (sizes and other
    variables may appear in the coefficient); None when it is not (a product of two terms that both move with it,
    floor division, remainder or clamping of it)."""
    if not depends(e, name):
        return ZERO
    op = e.op
    if op == "var":
        return ONE
    if op in ("add", "sub"):
        ca, cb = coefficient(e.args[0], name), coefficient(e.args[1], name)
        if ca is None or cb is None:
            return None
        return add(ca, cb) if op == "add" else sub(ca, cb)
    if op == "mul":
        a, b = e.args
        if not depends(a, name):
            cb = coefficient(b, name)
            return None if cb is None else mul(a, cb)
        if not depends(b, name):
            ca = coefficient(a, name)
            return None if ca is None else mul(ca, b)
    return None  # a product of two moving terms, //, %, clamp


_BUILD = {"add": add, "sub": sub, "mul": mul, "floordiv": floordiv, "mod": mod}
