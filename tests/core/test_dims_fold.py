"""``dims.fold``, how a backend prints a size it knows only partly: constants gathered, and ``(c * y + d) // c``
as ``y + d // c`` — a strided slice's length ``ceil((c * (n - 1) + 1) / c)`` prints as ``n``. Every folded form
evaluates as the expression it came from."""

from __future__ import annotations

import numpy as np
import pytest

from nnforge.ir.dims import _eval, fold, sym


def _both(d):
    return fold(d.expr, lambda name: True), d.expr


@pytest.mark.parametrize("stride", [1, 2, 5, 7])
def test_a_strided_slice_length_is_the_count_it_was_built_from(stride: int) -> None:
    n = sym("n", 40)
    last = stride * (n - 1) + 1
    length = (last + stride - 1) // stride  # what a slice [j : j + last : stride] has
    assert fold(length.expr, lambda name: True) == n.expr


def test_folded_sizes_evaluate_as_built(rng: np.random.Generator) -> None:
    x, y = sym("x", 3), sym("y", 4)
    sizes = [(5 * (x - 1) + 1 + 4) // 5, (5 * x - 3) // 5, (x * 3 + 7) // 3, (3 * (x + y) - 1) // 3,
             (2 * x + 1) // 4, ((x + 2) * 6 - 13) // 6, (x - 7) // 2]
    for d in sizes:
        folded, built = _both(d)
        for _ in range(50):
            env = {"x": int(rng.integers(-20, 40)), "y": int(rng.integers(-20, 40))}
            assert _eval(folded, env) == _eval(built, env), (d, env, folded)
    assert fold(((5 * x - 3) // 5).expr, lambda name: True) == ("sub", x.expr, ("const", 1))
    assert fold(((2 * x + 1) // 4).expr, lambda name: True)[0] == "floordiv"  # 4 does not divide 2 x: kept
