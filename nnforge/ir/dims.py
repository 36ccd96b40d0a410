"""Symbolic sizes that still behave as ints.

A traced function sees every input size as a ``Dim``: an ``int`` subclass that remembers how it was computed
from the inputs. User code runs unchanged (a Dim *is* its current value), while the IR keeps the recipe, so a
graph traced at T=10 can be re-specialized to T=37 without calling the Python function again. Arithmetic that
mixes Dims stays symbolic; anything else (``float()``, comparisons) uses the concrete value.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Mapping

# While a function is traced for nf.compile, the symbols of sizes that leave the symbolic world through float
# arithmetic (``1.0 / x.shape[0]``, ``float(T)``) are collected here: such a size is baked into the trace, so it
# must stay in the cache key. A context variable, so concurrent traces in other threads do not mix.
baked_symbols: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("nnforge_baked_symbols",
                                                                              default=None)


class Dim(int):
    """An int with a symbolic expression: ("sym", name) | ("add"|"sub"|"mul"|"floordiv"|"mod", a, b)."""

    expr: tuple

    def __new__(cls, value: int, expr: tuple) -> Dim:
        d = super().__new__(cls, value)
        d.expr = expr
        return d

    def __repr__(self) -> str:
        return render(self)

    def _combine(self, op: str, other: object, value: int, swap: bool = False) -> int:
        if not isinstance(other, int) or isinstance(other, bool):
            return NotImplemented
        if not isinstance(other, Dim):  # identities keep expressions short: x+0, x-0, 0+x, x*1, 1*x, x//1
            o = int(other)
            if (op == "add" and o == 0) or (op in ("mul",) and o == 1) or (
                    not swap and ((op == "sub" and o == 0) or (op == "floordiv" and o == 1))):
                return self
        a, b = (_expr(other), self.expr) if swap else (self.expr, _expr(other))
        return Dim(value, (op, a, b))

    def __add__(self, o):
        return self._combine("add", o, int(self) + int(o)) if isinstance(o, int) else NotImplemented

    def __radd__(self, o):
        return self._combine("add", o, int(o) + int(self), swap=True) if isinstance(o, int) else NotImplemented

    def __sub__(self, o):
        return self._combine("sub", o, int(self) - int(o)) if isinstance(o, int) else NotImplemented

    def __rsub__(self, o):
        return self._combine("sub", o, int(o) - int(self), swap=True) if isinstance(o, int) else NotImplemented

    def __mul__(self, o):
        return self._combine("mul", o, int(self) * int(o)) if isinstance(o, int) else NotImplemented

    def __rmul__(self, o):
        return self._combine("mul", o, int(o) * int(self), swap=True) if isinstance(o, int) else NotImplemented

    def __floordiv__(self, o):
        return self._combine("floordiv", o, int(self) // int(o)) if isinstance(o, int) else NotImplemented

    def __rfloordiv__(self, o):
        return self._combine("floordiv", o, int(o) // int(self), swap=True) if isinstance(o, int) else NotImplemented

    def __mod__(self, o):
        return self._combine("mod", o, int(self) % int(o)) if isinstance(o, int) else NotImplemented

    def __neg__(self):
        return Dim(-int(self), ("sub", ("const", 0), self.expr))

    def _bake(self) -> None:
        seen = baked_symbols.get()
        if seen is not None:
            seen |= free_symbols(self)

    def __float__(self) -> float:
        self._bake()
        return float(int(self))

    def __truediv__(self, o):
        self._bake()
        return int(self) / o

    def __rtruediv__(self, o):
        self._bake()
        return o / int(self)

    def __pow__(self, o, mod=None):
        self._bake()
        return pow(int(self), o, mod)

    def __hash__(self) -> int:
        return int.__hash__(self)

    def __eq__(self, o: object) -> bool:
        return int(self) == o

    def __reduce__(self):
        return (Dim, (int(self), self.expr))


def _expr(x: int) -> tuple:
    return x.expr if isinstance(x, Dim) else ("const", int(x))


def _factors(e: tuple) -> tuple[int, list[tuple]]:
    """A size expression as (constant, other factors): its product flattened."""
    if e[0] == "const":
        return e[1], []
    if e[0] == "mul":
        (ca, fa), (cb, fb) = _factors(e[1]), _factors(e[2])
        return ca * cb, fa + fb
    return 1, [e]


def same_product(a: int, b: int) -> bool:
    """Whether sizes ``a`` and ``b`` are equal whatever the run-time sizes: products of the same factors (``5 * L``
    and ``L * 5``). False may mean unknown (sums are compared as they were built)."""
    (ca, fa), (cb, fb) = (_factors(_expr(x)) for x in (a, b))
    return ca == cb and sorted(map(repr, fa)) == sorted(map(repr, fb))


SIZE_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
            "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b}
"""The arithmetic of size (and index) expressions; floor division and its remainder, as Python's."""
SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "mod": "%"}


def _eval(expr: tuple, env: Mapping[str, int]) -> int:
    kind = expr[0]
    if kind == "const":
        return expr[1]
    if kind == "sym":
        return env[expr[1]] if expr[1] in env else expr[2]
    return SIZE_OPS[kind](_eval(expr[1], env), _eval(expr[2], env))


def _make(expr: tuple, env: Mapping[str, int]) -> int:
    """Evaluate ``expr`` under env and keep it symbolic, so a specialized graph can be specialized again."""
    return Dim(_eval(expr, env), expr) if expr[0] != "const" else expr[1]


def sym(name: str, value: int) -> Dim:
    """A fresh symbolic size ``name`` whose current value is ``value``."""
    return Dim(value, ("sym", name, value))


def symbol_name(d: object) -> str | None:
    """The name of a size that is one bare symbol (a loop length T, a row count), None for anything else."""
    return d.expr[1] if isinstance(d, Dim) and d.expr[0] == "sym" else None


def _each_dim(x: object, fn: Callable[[Dim], object]) -> object:
    """``x`` (an int, a Dim, or a tuple or list of them) with ``fn`` applied to every Dim in it."""
    if isinstance(x, Dim):
        return fn(x)
    if isinstance(x, tuple):
        return tuple(_each_dim(v, fn) for v in x)
    if isinstance(x, list):
        return [_each_dim(v, fn) for v in x]
    return x


def substitute(x: object, env: Mapping[str, int]) -> object:
    """Re-evaluate every Dim inside ``x`` (an int, tuple, list or dict of them) under ``env``."""
    return _each_dim(x, lambda d: _make(d.expr, env))


def renamed(x: object, names: Mapping[str, str]) -> object:
    """``x`` (a Dim, or a tuple or list of them) with each symbol of ``names`` replaced by the one it names."""
    return _each_dim(x, lambda d: Dim(int(d), _renamed(d.expr, names)))


def _renamed(e: tuple, names: Mapping[str, str]) -> tuple:
    if e[0] == "sym":
        return ("sym", names[e[1]], e[2]) if e[1] in names else e
    if e[0] == "const":
        return e
    return (e[0], _renamed(e[1], names), _renamed(e[2], names))


def free_symbols(x: object) -> set[str]:
    """Names of the symbols a Dim (or nested tuple of them) depends on."""
    out: set[str] = set()

    def walk(e: tuple) -> None:
        if e[0] == "sym":
            out.add(e[1])
        elif e[0] != "const":
            walk(e[1])
            walk(e[2])

    def visit(v: object) -> None:
        if isinstance(v, Dim):
            walk(v.expr)
        elif isinstance(v, (tuple, list)):
            for u in v:
                visit(u)

    visit(x)
    return out


def fixed(x: object, run_time: set[str]) -> int | None:
    """The value of size ``x`` (the product, for a tuple of sizes) where none depends on a symbol of
    ``run_time`` (sizes known only when the program runs), else None."""
    if free_symbols(x) & run_time:
        return None
    return math.prod(int(d) for d in x) if isinstance(x, tuple | list) else int(x)  # type: ignore[call-overload]


def fold(e: tuple, keep: Callable[[str], bool]) -> tuple:
    """Size expression ``e`` with the symbols ``keep`` refuses as their values, constant operations evaluated and
    the constants of sums and differences gathered into one: how a backend prints a size it knows only partly
    (equal folded expressions print alike)."""
    if e[0] == "sym":
        return e if keep(e[1]) else ("const", e[2])
    if e[0] == "const":
        return e
    a, b = fold(e[1], keep), fold(e[2], keep)
    if a[0] == b[0] == "const":
        return ("const", SIZE_OPS[e[0]](a[1], b[1]))
    if e[0] in ("add", "sub") and (b[0] == "const" or (e[0] == "add" and a[0] == "const")):
        x, c = (a, b[1]) if b[0] == "const" else (b, a[1])
        base, offset = _affine(x)
        return _offset(base, offset + (c if e[0] == "add" else -c))
    if e[0] == "floordiv" and b[0] == "const" and b[1] > 0:
        # (c * y + d) // c == y + d // c for integers: a strided slice's length, ceil((c * (n - 1) + 1) / c), is n
        base, offset = _affine(a)
        y = _multiple(base, b[1])
        if y is not None:
            inner, k = _affine(y)
            return _offset(inner, k + offset // b[1])
    return (e[0], a, b)


def _multiple(e: tuple, c: int) -> tuple | None:
    """y for a folded ``e`` = c * y (or y * c), else None."""
    if e[0] == "mul":
        if e[1] == ("const", c):
            return e[2]
        if e[2] == ("const", c):
            return e[1]
    return None


def _affine(e: tuple) -> tuple[tuple, int]:
    """(x, c) with e = x + c for a folded size expression."""
    if e[0] in ("add", "sub") and e[2][0] == "const":
        return e[1], e[2][1] if e[0] == "add" else -e[2][1]
    return e, 0


def _offset(x: tuple, c: int) -> tuple:
    return x if c == 0 else ("add", x, ("const", c)) if c > 0 else ("sub", x, ("const", -c))


def render(x: int, symbol: Callable[[str, int], str] | None = None) -> str:
    """Human-readable form: plain ints as digits, symbolic sizes by their name (``T``, ``x.0+1``); ``symbol``
    spells a symbol from its name and current value instead (the IR printer's ``T``, or a value)."""
    if not isinstance(x, Dim):
        return str(int(x))
    spell = symbol or (lambda name, _value: name)

    def r(e: tuple) -> str:
        if e[0] == "const":
            return str(e[1])
        if e[0] == "sym":
            return spell(e[1], e[2])
        return f"({r(e[1])}{SYMBOLS[e[0]]}{r(e[2])})"

    s = r(x.expr)
    return s[1:-1] if s.startswith("(") else s
