"""Index expressions as data (``ir.expr``, ``ir.index``) and their C spelling (``Sizes.index``): the simplifying
operators keep values, ``//`` and ``%`` are the prelude's floor division, the printed C computes what
``evaluate`` does, and which reads are contiguous along a vector lane is judged on the expression."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from nnforge.codegen.c.cexpr import PRELUDE, Sizes, lane_stride
from nnforge.dtypes import DType
from nnforge.ir.dims import sym
from nnforge.ir.expr import (
    ONE,
    ZERO,
    Expr,
    clamp,
    coefficient,
    const,
    evaluate,
    replace_var,
    row_major,
    size,
    var,
)
from nnforge.ir.index import index_map
from nnforge.ir.node import Node
from nnforge.ir.ops import Op

i, j, k = var("i"), var("j"), var("k")
NAMES = ("i", "j", "k")


def test_simplification() -> None:
    assert const(2) + const(3) == const(5)
    assert i * 1 == i and 1 * i == i and i + 0 == i and 0 + i == i and i - 0 == i and i // 1 == i
    assert i * 0 == ZERO and i % 1 == ZERO
    assert 5 + (3 + i) == 8 + i  # a slice of a slice: the starts gathered
    assert (i + 3) + 5 == i + 8
    assert 4 * (8 * i) == 32 * i
    assert (i + 2) * 3 != (i + 3) * 2  # structural equality, not by value at some point


def _c(e: Expr, sz: Sizes | None = None) -> str:
    return (sz or Sizes([])).index(e)


def test_printing() -> None:
    """The spellings the kernels have always had: Horner offsets, slices, regrouping reshapes, run-time sizes."""
    T = sym("T", 10)
    sz = Sizes(["T"])
    assert _c(row_major([i, j, k], [const(3), const(64), const(96)])) == "((i) * 64 + j) * 96 + k"
    assert _c(row_major([i, ZERO], [const(8), ONE])) == "(i) * 1 + 0"  # kept as is: gcc folds it
    assert _c(row_major([ZERO, ZERO, k], [ONE, ONE, const(5)])) == "k"
    assert _c(const(5) + j * -1) == "5 + (j) * (-1)"
    assert _c((i * 96 + j) // 8 % 12) == "(((i) * 96 + j) / (8)) % (12)"
    assert _c(row_major([i, j], [size(T), size(T)]), sz) == "(i) * S[0] + j"
    assert _c(96 * size(T), sz) == "96 * S[0]"
    assert _c(i - (j + 1)) == "((i) - (j + 1))"
    assert _c(clamp(i - 4, const(6))) == "(((i) - 4) < 0 ? 0 : (((i) - 4) >= 6 ? 6 - 1 : ((i) - 4)))"
    assert _c(i + 8 + -11) == "i - 3"


def _random_expr(rng: np.random.Generator, depth: int, nonneg: bool = False) -> Expr:
    """A random expression over i, j, k; with ``nonneg`` one whose value is >= 0 for non-negative variables (the
    dividend of a C ``/`` must be, for it to agree with floor division)."""
    if depth == 0 or rng.random() < 0.25:
        if rng.random() < 0.5:
            return var(NAMES[rng.integers(3)])
        return const(int(rng.integers(0 if nonneg else -6, 7)))
    ops = ["add", "mul", "floordiv", "mod", "clamp"] + ([] if nonneg else ["sub"])
    op = ops[rng.integers(len(ops))]
    a = _random_expr(rng, depth - 1, nonneg or op in ("floordiv", "mod"))
    if op in ("floordiv", "mod"):
        return a // int(rng.integers(1, 9)) if op == "floordiv" else a % int(rng.integers(1, 9))
    if op == "clamp":
        return clamp(a, const(int(rng.integers(1, 9))))
    b = _random_expr(rng, depth - 1, nonneg)
    return {"add": a + b, "sub": a - b, "mul": a * b}[op]


def test_operators_keep_values(rng: np.random.Generator) -> None:
    """Each simplifying operator equals the plain operation at sample points (negative operands included)."""
    for _ in range(300):
        a, b = _random_expr(rng, 2), _random_expr(rng, 2)
        d = int(rng.choice([-7, -3, -1, 1, 2, 5]))
        for _ in range(4):
            env = {n: int(rng.integers(-20, 21)) for n in NAMES}
            x, y = evaluate(a, env), evaluate(b, env)
            assert evaluate(a + b, env) == x + y
            assert evaluate(a - b, env) == x - y
            assert evaluate(a * b, env) == x * y
            assert evaluate(a // d, env) == x // d
            assert evaluate(a % d, env) == x % d
            # the gathered forms: constants of sums and products folded together
            assert evaluate(d + (3 + a), env) == d + 3 + x == evaluate((a + d) + 3, env)
            assert evaluate(d * (3 * a), env) == 3 * d * x


def test_replacing_a_variable_keeps_values(rng: np.random.Generator) -> None:
    """``replace_var`` evaluates as the original with the variable's value, and folds what becomes constant (a
    shift's ``i - 2`` at ``i = 0`` is the constant ``-2``: the scheduler reads a padded read's offset so)."""
    assert replace_var(i - 2, "i", ZERO) == const(-2)
    assert replace_var((i + 3) * 4 + j, "i", const(1)) == 16 + j
    for _ in range(200):
        e = _random_expr(rng, 3)
        env = {n: int(rng.integers(-20, 21)) for n in NAMES}
        for name in NAMES:
            value = _random_expr(rng, 1)
            assert evaluate(replace_var(e, name, value), env) == evaluate(e, {**env, name: evaluate(value, env)})


def _run_c(body: str, tmp: Path) -> list[int]:
    """The integers a C ``main`` with ``body`` prints (the prelude's ``nf_floordiv`` and ``nf_mod`` in scope)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    helpers = [line for line in PRELUDE.splitlines() if re.match(r"static inline int64_t nf_(floordiv|mod)\(", line)]
    src, exe = tmp / "t.c", tmp / "t"
    src.write_text("\n".join(["#include <stdio.h>", "#include <stdint.h>", *helpers, "int main(void) {", body,
                              "return 0;", "}", ""]))
    subprocess.run([cc, "-O1", str(src), "-o", str(exe)], check=True, capture_output=True)
    return [int(v) for v in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]


def test_floor_division_is_the_preludes(tmp_path: Path) -> None:
    """``//`` and ``%`` of expressions (folded, and evaluated) are ``nf_floordiv`` / ``nf_mod`` on negatives too."""
    pairs = [(a, b) for a in range(-9, 10) for b in (-4, -3, -1, 1, 2, 3, 5)]
    body = "\n".join(f'printf("%lld %lld\\n", (long long)nf_floordiv({a}, {b}), (long long)nf_mod({a}, {b}));'
                     for a, b in pairs)
    got = _run_c(body, tmp_path)
    for n, (a, b) in enumerate(pairs):
        assert (const(a) // b).value == got[2 * n] == evaluate(i // b, {"i": a})
        assert (const(a) % b).value == got[2 * n + 1] == evaluate(i % b, {"i": a})


def test_printed_c_computes_the_expression(rng: np.random.Generator, tmp_path: Path) -> None:
    """Random index expressions (non-negative variables, as loop indices are) printed as C and run: parentheses
    and the C ``/`` and ``%`` of the printer agree with ``evaluate``."""
    exprs = [_random_expr(rng, 3) for _ in range(120)]  # small enough not to overflow int64
    envs = [{n: int(rng.integers(0, 30)) for n in NAMES} for _ in range(3)]
    lines = []
    for env in envs:
        decl = " ".join(f"const int64_t {n} = {v};" for n, v in env.items())
        lines += [f"{{ {decl} printf(\"%lld\\n\", (long long)({_c(e)})); }}" for e in exprs]
    got = _run_c("\n".join(lines), tmp_path)
    assert got == [evaluate(e, env) for env in envs for e in exprs]


def _node(op: Op, src_shape: tuple[int, ...], shape: tuple[int, ...], **attrs) -> Node:
    src = Node(Op.INPUT, (), {}, src_shape, DType.float32)
    return Node(op, (src,), attrs, shape, DType.float32)


CASES = {  # a view read at output index (i, j); the lane is j
    "contiguous": (lambda: index_map(_node(Op.SLICE, (6, 40), (6, 16), starts=(0, 8), steps=(1, 1)), [i, j]), 1),
    "broadcast": (lambda: index_map(_node(Op.EXPAND, (6, 1), (6, 16)), [i, j]), 0),
    "strided": (lambda: index_map(_node(Op.SLICE, (6, 40), (6, 16), starts=(0, 1), steps=(1, 2)), [i, j]), None),
    "transposed": (lambda: index_map(_node(Op.PERMUTE, (16, 6), (6, 16), perm=(1, 0)), [i, j]), None),
    "floordiv": (lambda: [i, j // 4], None),  # an upsampling read
    # a regrouping reshape reads at floor divisions of the lane: not judged linear, though this one's flat
    # index is (a conservative None: the scalar loop is kept)
    "reshape": (lambda: index_map(_node(Op.RESHAPE, (6, 4, 4), (6, 16)), [i, j]), None),
    "negative step": (lambda: index_map(_node(Op.SLICE, (6, 16), (6, 16), starts=(0, 15), steps=(1, -1)),
                                        [i, j]), None),
    "cancelled": (lambda: [i, j - j], None),  # names the lane: must not be hoisted out of its loop
}


@pytest.mark.parametrize("case", list(CASES))
def test_lane_coefficient(rng: np.random.Generator, case: str) -> None:
    """The lane's coefficient in the flat index of the source, against the index evaluated at sample points:
    a constant step when linear (1: a vector load, 0: lane-invariant), a varying one when not."""
    make, want = CASES[case]
    src_idx = make()
    shapes = {"contiguous": (6, 40), "broadcast": (6, 1), "strided": (6, 40), "transposed": (16, 6),
              "floordiv": (6, 4), "reshape": (6, 4, 4), "negative step": (6, 16), "cancelled": (6, 16)}
    flat = row_major(src_idx, [const(d) for d in shapes[case]])
    assert lane_stride(flat, "j") == want
    c = coefficient(flat, "j")
    steps = set()
    for _ in range(20):
        env = {"i": int(rng.integers(0, 6)), "j": int(rng.integers(0, 15))}
        step = evaluate(flat, {**env, "j": env["j"] + 1}) - evaluate(flat, env)
        steps.add(step)
        if c is not None:
            assert step == evaluate(c, env)
    if case == "floordiv":
        assert c is None and len(steps) > 1
    if want is not None:
        assert steps == {want}


def test_a_reshape_between_two_symbols_of_one_fixed_size_reads_each_axis_alone() -> None:
    """``[T, N, 8]`` read as ``[T', N', 8]`` (a cotangent's sizes and the input's, traced as symbols of their own):
    the same sizes once the program fixes them, so each axis is read at its own index, not at divisions of the
    flat offset (which kept a layer norm's weight gradient from reading rows unit-stride). Where the sizes stay
    symbols (given per call) the blocks merge: their products are not known to agree."""
    T, N, T2, N2 = sym("T", 5), sym("N", 3), sym("U", 5), sym("M", 3)
    src = Node(Op.INPUT, (), {}, (T, N, 8), DType.float32)
    view = Node(Op.RESHAPE, (src,), {}, (T2, N2, 8), DType.float32)
    assert index_map(view, [i, j, k], lambda d: const(int(d))) == [i, j, k]
    merged = index_map(view, [i, j, k])
    assert merged[2] != k and all(evaluate(row_major(merged, [const(5), const(3), const(8)]), env) ==
                                  evaluate(row_major([i, j, k], [const(5), const(3), const(8)]), env)
                                  for env in ({"i": 4, "j": 2, "k": 7}, {"i": 1, "j": 0, "k": 3}))
