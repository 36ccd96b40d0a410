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

    def __new__(cls, value: int, expr: tuple, poly: Poly | None = None) -> Dim:
        d = super().__new__(cls, value)
        d.expr = expr
        # the normal form's polynomial, kept so that arithmetic on this size need not parse ``expr`` again; a tuple,
        # which the garbage collector stops tracking (a dict per size kept it busy: docs/benchmarks.md)
        d._terms = None if poly is None else tuple(poly.items())
        return d

    def poly(self) -> Poly:
        """This size's expression as a polynomial (``normal``'s), a new dict."""
        if self._terms is None:
            self._terms = tuple(_poly(self.expr).items())
        return dict(self._terms)

    def __repr__(self) -> str:
        return render(self)

    def _combine(self, op: str, other: object, value: int, swap: bool = False) -> int:
        if not isinstance(other, int) or isinstance(other, bool):
            return NotImplemented
        if self.expr[0] == "sym" and not isinstance(other, Dim) and op in ("add", "sub") and not swap:
            c = int(other) if op == "add" else -int(other)  # most arithmetic on sizes: T + c, as normal spells it
            return self if c == 0 else Dim(value, ("add", self.expr, ("const", c)) if c > 0 else
                                           ("sub", self.expr, ("const", -c)))
        o = other.poly() if isinstance(other, Dim) else _poly(("const", int(other)))
        p = _applied(op, o, self.poly()) if swap else _applied(op, self.poly(), o)
        expr = _build(p)
        return expr[1] if expr[0] == "const" else Dim(value, expr, p)

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

    def __rmod__(self, o):
        return self._combine("mod", o, int(o) % int(self), swap=True) if isinstance(o, int) else NotImplemented

    def __divmod__(self, o):
        return (self // o, self % o) if isinstance(o, int) else NotImplemented

    def __rdivmod__(self, o):
        return (o // self, o % self) if isinstance(o, int) else NotImplemented

    def __neg__(self):
        return self._combine("sub", 0, -int(self), swap=True)

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

    def __rpow__(self, o, mod=None):
        self._bake()
        return pow(o, int(self), mod)

    def __hash__(self) -> int:
        return int.__hash__(self)

    def __eq__(self, o: object) -> bool:
        return int(self) == o

    def __reduce__(self):
        return (Dim, (int(self), self.expr))


def _expr(x: int) -> tuple:
    return x.expr if isinstance(x, Dim) else ("const", int(x))


Poly = dict[tuple[tuple, ...], int]
"""A size as a polynomial: each monomial (its non-constant factors, sorted; () for the constant) with its
coefficient."""


def normal(e: tuple) -> tuple:
    """Size expression ``e`` in one normal form: a sum of monomials with their constants gathered, products
    multiplied out, and floor divisions and remainders by a monomial taken exactly where the dividend's terms are
    multiples of it (``(5 * (n - 1) + 5) // 5`` is ``n``). Equal sizes built different ways (a convolution's
    ``T + 2 + 2 - 5 + 1`` and ``T``) then have one recipe: they print alike and compare equal in the IR."""
    return _build(_poly(e))


def _poly(e: tuple) -> Poly:
    kind = e[0]
    if kind == "const":
        return {(): e[1]} if e[1] else {}
    if kind == "sym":
        return {(e,): 1}
    return _applied(kind, _poly(e[1]), _poly(e[2]))


def _applied(kind: str, a: Poly, b: Poly) -> Poly:
    """The polynomial of ``a <kind> b``."""
    if kind in ("add", "sub"):
        out = dict(a)
        for m, k in b.items():
            out[m] = out.get(m, 0) + (k if kind == "add" else -k)
        return {m: k for m, k in out.items() if k}
    if kind == "mul":
        out = {}
        for ma, ka in a.items():
            for mb, kb in b.items():
                m = tuple(sorted(ma + mb))  # atoms of one kind have one structure: tuples compare
                out[m] = out.get(m, 0) + ka * kb
        return {m: k for m, k in out.items() if k}
    return _divided(kind, a, b)


def _divided(kind: str, a: Poly, b: Poly) -> Poly:
    """``a // b`` or ``a % b``: for a divisor ``d`` that is one monomial with a positive coefficient, the terms of
    ``a`` that are multiples of ``d`` (q * d) leave the division exactly — (q * d + r) // d == q + r // d and
    (q * d + r) % d == r % d for integers — and what remains (r) stays one atom of the result."""
    if len(b) != 1 or next(iter(b.values())) <= 0:
        return _atom(kind, a, b)
    (mb, kb), = b.items()
    quotient: Poly = {}
    rest: Poly = {}
    for m, k in a.items():
        left = _without(m, mb)
        if left is not None and k % kb == 0:
            quotient[left] = k // kb
        else:
            rest[m] = k
    if not rest:
        tail: Poly = {}
    elif list(rest) == [()] and mb == ():
        r = rest[()] // kb if kind == "floordiv" else rest[()] % kb
        tail = {(): r} if r else {}
    else:
        tail = _atom(kind, rest, b)
    if kind == "mod":
        return tail
    out = dict(quotient)
    for m, k in tail.items():
        out[m] = out.get(m, 0) + k
    return {m: k for m, k in out.items() if k}


def _atom(kind: str, a: Poly, b: Poly) -> Poly:
    return {((kind, _build(a), _build(b)),): 1}


def _common_factors(monomials: list[tuple]) -> tuple:
    """The factors every monomial has (with their multiplicity)."""
    common = list(monomials[0])
    for m in monomials[1:]:
        rest = list(m)
        common = [f for f in common if f in rest and not rest.remove(f)]  # type: ignore[func-returns-value]
    return tuple(common)


def _without(m: tuple, d: tuple) -> tuple | None:
    """Monomial ``m`` divided by monomial ``d`` (both sorted factor tuples), or None where ``d`` does not divide
    it."""
    left = list(m)
    for f in d:
        if f not in left:
            return None
        left.remove(f)
    return tuple(left)


def _build(p: Poly) -> tuple:
    """The expression of a polynomial: the factors its terms share outside, then its monomials in a fixed
    order, each ``x * k``, those with a positive coefficient first (a constant alone where there are none: ``0 -
    T``), then the negative ones, the constant last."""
    def term(m: tuple, k: int) -> tuple:
        factors = m[0]
        for f in m[1:]:
            factors = ("mul", factors, f)
        return factors if k == 1 else ("mul", factors, ("const", k))

    if len(p) > 1:  # (T + 1) * N * 4 rather than T * N * 4 + N * 4
        g, common = math.gcd(*p.values()), _common_factors(list(p))
        if common:
            inner = _build({_without(m, common): k for m, k in p.items()})  # type: ignore[misc]
            return ("mul", inner, _build({common: 1}))
        if g > 1:
            return ("mul", _build({m: k // g for m, k in p.items()}), ("const", g))
    monomials = sorted(m for m in p if m)
    c = p.get((), 0)
    out: tuple | None = None
    for m in (m for m in monomials if p[m] > 0):
        out = term(m, p[m]) if out is None else ("add", out, term(m, p[m]))
    if out is None:
        out, c = ("const", c), 0
    for m in (m for m in monomials if p[m] < 0):
        out = ("sub", out, term(m, -p[m]))
    return out if c == 0 else ("add", out, ("const", c)) if c > 0 else ("sub", out, ("const", -c))


def _factors(e: tuple) -> tuple[int, list[tuple]]:
    """A size expression as (constant, other factors): its product flattened."""
    if e[0] == "const":
        return e[1], []
    if e[0] == "mul":
        (ca, fa), (cb, fb) = _factors(e[1]), _factors(e[2])
        return ca * cb, fa + fb
    return 1, [e]


def same_size(a: int, b: int) -> bool:
    """Whether sizes ``a`` and ``b`` are equal whatever the run-time sizes: their normal forms agree (``T - 1``
    built two ways), not only their values at trace time."""
    return int(a) == int(b) and normal(_expr(a)) == normal(_expr(b))


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


def value_at(x: int, env: Mapping[str, int]) -> int:
    """The value of size ``x`` with the symbols of ``env`` at their sizes there (the others at their own)."""
    return _eval(_expr(x), env)


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


def expressed(x: object, sizes: Mapping[str, int]) -> object:
    """``x`` (a Dim, or a tuple or list of them) with each symbol of ``sizes`` replaced by that size's expression
    and brought to the normal form (a sequence's length tied to another's: ``T1`` read as ``(T + 1) // 2``)."""
    exprs = {name: _expr(d) for name, d in sizes.items()}

    def replace(d: Dim) -> int:
        if not free_symbols(d) & exprs.keys():
            return d
        e = normal(_replaced(d.expr, exprs))
        return e[1] if e[0] == "const" else Dim(int(d), e)

    return _each_dim(x, replace)


def _replaced(e: tuple, exprs: Mapping[str, tuple]) -> tuple:
    if e[0] == "sym":
        return exprs.get(e[1], e)
    if e[0] == "const":
        return e
    return (e[0], _replaced(e[1], exprs), _replaced(e[2], exprs))


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
