"""Symbolic sizes in one normal form: built any way, a size has one recipe, and that recipe evaluates as the
arithmetic it came from at every value of its symbols (a graph traced at one length is run at others)."""

from __future__ import annotations

import operator

import numpy as np
import pytest

from nnforge.ir.dims import Dim, _eval, baked_symbols, normal, render, same_product, sym

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod}


def _replay(start: str, steps: list[tuple[str, object]], t: int, n: int) -> int:
    """The arithmetic of one random recipe on sizes ``t`` and ``n`` (plain ints or Dims)."""
    x = {"t": t, "n": n, "t+1": t + 1}[start]
    for op, y in steps:
        x = OPS[op](x, {"t": t, "n": n}.get(y, y) if isinstance(y, str) else y)
    return x


def test_a_normal_form_evaluates_as_its_recipe_at_every_size(rng: np.random.Generator) -> None:
    checked = 0
    for _ in range(3000):
        start = str(rng.choice(["t", "n", "t+1"]))
        steps = [(str(rng.choice(list(OPS))), ["t", "n", int(rng.integers(-3, 8))][int(rng.integers(3))])
                 for _ in range(int(rng.integers(1, 7)))]
        try:
            d = _replay(start, steps, sym("T", 13), sym("N", 4))
        except ZeroDivisionError:
            continue
        if not isinstance(d, Dim):
            continue
        for t, n in ((0, 1), (3, 2), (13, 4), (17, 5), (40, 7), (101, 3)):
            try:
                want = _replay(start, steps, t, n)
            except ZeroDivisionError:
                continue
            assert _eval(d.expr, {"T": t, "N": n}) == want, (start, steps, d.expr, t, n)
            checked += 1
    assert checked > 5000  # most recipes stay symbolic and divide by no zero


def test_equal_sizes_built_differently_have_one_recipe() -> None:
    t, n = sym("T", 200), sym("N", 4)
    same_length = t + 2 + 2 - 5 + 1  # a "same"-padded convolution of kernel 5
    assert same_length.expr == t.expr and render(same_length) == "T"
    strided = (t + 9 + 9 - 19) // 5 + 1  # kernel 19, stride 5, padding 9
    assert render(strided) == "((T-1)//5)+1"
    assert (5 * (strided - 1) + 1 + 4) // 5 == strided and ((5 * (strided - 1) + 1 + 4) // 5).expr == strided.expr
    assert (n * t).expr == (t * n).expr and same_product(n * t * 4, 4 * (t * n))
    assert (n * strided).expr == (strided * n).expr
    assert render(n * strided) == "(((T-1)//5)+1)*N"
    assert (n * t * 6 // (3 * n)).expr == (t * 2).expr  # an exact division by a monomial
    assert ((n * t + 3) % n).expr == (3 % n).expr
    assert render(5 - t) == "5-T" and render(-t) == "0-T"
    for c in (-3, 0, 4):  # a symbol plus a constant, built without the polynomial, in the same form
        assert (t + c).expr == normal(("add", t.expr, ("const", c))) and (t - c).expr == normal(
            ("sub", t.expr, ("const", c)))


def test_a_size_that_no_longer_depends_on_a_symbol_is_an_int() -> None:
    t = sym("T", 9)
    for d in (t - t + 3, (t + 1) - t, (t * 4) // t, (t * 6) % t, -t + t):
        assert type(d) is int
    assert (t - t + 3, (t + 1) - t, (t * 4) // t) == (3, 1, 4)


def test_reflected_arithmetic_stays_symbolic_or_is_recorded() -> None:
    """``5 % T`` and ``divmod(5, T)`` are sizes that change with T; ``2 ** T`` leaves the symbolic world and is
    recorded as baked (the compile cache then keys on T's value)."""
    t = sym("T", 7)
    for d in (5 % t, divmod(5, t)[0], divmod(5, t)[1], divmod(t, 3)[1]):
        assert isinstance(d, Dim)
    assert _eval((20 % t).expr, {"T": 7}) == 6 and _eval((20 % t).expr, {"T": 3}) == 2
    token = baked_symbols.set(set())
    try:
        assert 2 ** t == 128 and baked_symbols.get() == {"T"}
    finally:
        baked_symbols.reset(token)


@pytest.mark.parametrize("stride", [1, 2, 5])
def test_a_strided_slice_of_a_strided_span_is_its_count(stride: int) -> None:
    n = sym("n", 40)
    last = stride * (n - 1) + 1
    assert ((last + stride - 1) // stride).expr == n.expr
