"""Structural keys of a program's top-level steps: equal for the same computation on other buffers, different
as soon as a size, a constant, an op, a decision or the pattern of buffers read differs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import nnforge as nf
from nnforge.codegen.c import prepare
from nnforge.codegen.c.target import cpu_target
from nnforge.schedule import Loop, schedule
from nnforge.schedule.identical import step_keys

sys.path.insert(0, str(Path(__file__).parents[1] / "codegen"))
from test_parts import stack, stack_args


def _keys(fn, args):
    program = schedule(prepare(nf.compile(fn).trace(*args)), cpu_target())
    return program, step_keys(program)


def test_layers_of_one_shape_have_one_key() -> None:
    """The three LSTM layers of a stack: each scan's key is the same (its buffers differ, not its code)."""
    program, keys = _keys(stack, stack_args(T=5, N=16, H=5))
    scans = [key for k, key in zip(program.block.kernels, keys) if isinstance(k, Loop)]
    assert len(scans) == 3 and len(set(scans)) == 1
    others = [key for k, key in zip(program.block.kernels, keys) if not isinstance(k, Loop)]
    assert scans[0] not in others


def test_a_layer_of_another_width_has_another_key() -> None:
    def two(x, w1, u1, b1, w2, u2, b2):
        h = x
        for w, u, b in ((w1, u1, b1), (w2, u2, b2)):
            h0 = nf.zeros((x.shape[1], u.shape[1]))

            def cell(carry, x_t, w=w, u=u, b=b):
                h, c = carry
                i, f, g, o = (x_t @ w.T + h @ u.T + b).chunk(4, axis=-1)
                c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
                h = nf.sigmoid(o) * nf.tanh(c)
                return (h, c), h

            _, h = nf.scan(cell, (h0, h0), h)
        return h

    rng = np.random.default_rng(0)
    shapes = [(5, 3, 4), (16, 4), (16, 4), (16,), (24, 4), (24, 6), (24,)]
    program, keys = _keys(two, [rng.standard_normal(s).astype(np.float32) for s in shapes])
    scans = [key for k, key in zip(program.block.kernels, keys) if isinstance(k, Loop)]
    assert len(scans) == 2 and scans[0] != scans[1]


def test_buffers_constants_and_ops_take_part() -> None:
    """tanh(x * y) and tanh(y * x) are one computation on two buffers; tanh(x * x) reads one buffer twice; a
    different constant or op is different code."""

    def fn(x, y):
        return nf.tanh(x * y), nf.tanh(y * x), nf.tanh(x * x), nf.tanh(x * 2.0), nf.tanh(x * 3.0), nf.exp(x * 3.0)

    rng = np.random.default_rng(1)
    _, keys = _keys(fn, [rng.standard_normal((4, 6)).astype(np.float32) for _ in range(2)])
    assert len(keys) == 6
    assert keys[0] == keys[1]
    assert len({keys[0], *keys[2:]}) == 5


def test_run_time_lengths_are_kept_as_symbols() -> None:
    """Sizes computed from a run-time length are keyed by their expression: a stack's scans over the same T share
    a key, a scan over a length of its own does not."""

    def fn(x, z):
        def cell(h, x_t):
            h = nf.tanh(h + x_t)
            return h, h

        _, a = nf.scan(cell, x[0], x)
        _, b = nf.scan(cell, x[0], a)
        _, c = nf.scan(cell, z[0], z)
        return a, b, c

    rng = np.random.default_rng(2)
    x, z = rng.standard_normal((5, 3, 4)).astype(np.float32), rng.standard_normal((5, 3, 4)).astype(np.float32)
    program, keys = _keys(fn, [x, z])
    scans = [key for k, key in zip(program.block.kernels, keys) if isinstance(k, Loop)]
    assert len(scans) == 3 and scans[0] == scans[1] != scans[2]


def test_products_of_views_differing_only_in_extent_differ(rng: np.random.Generator) -> None:
    """``a[:, :2] @ b[:2]`` and ``a @ c`` read their operands at the same offsets with the same strides and give
    the same shape; only K differs, the extent of the views. Keyed alike, the C backend emitted one of them for
    both (it raised, finding their code different: a weight gradient split by rows hit it)."""
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((6, 5), (5, 3), (5, 3)))

    def fn(a, b, c):
        return a[:, :2] @ b[:2], a @ c

    _, keys = _keys(fn, [a, b, c])
    assert len(keys) == 2 and keys[0] != keys[1]
    got = nf.compile(fn, backend="cpu")(a, b, c)
    np.testing.assert_allclose(got[0], a[:, :2] @ b[:2], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], a @ c, rtol=1e-5, atol=1e-5)


def test_a_one_element_matrix_and_its_transpose_are_keyed_apart(rng: np.random.Generator) -> None:
    """``b * c`` and ``b.T * c`` for a ``[1, 1]`` b read it at the same offset with the same strides, but the C
    indexes the transpose's axes the other way round; keyed alike, the backend raised finding their code
    different (the fuzzer's scan of a 1 x 1 carry hit it). The views a step reads through are in its key."""
    b, c = rng.standard_normal((1, 1)), rng.standard_normal((1, 1))

    def fn(b, c):
        return b * c, b.T * c

    _, keys = _keys(fn, [b, c])
    assert len(keys) == 2 and keys[0] != keys[1]
    got = nf.compile(fn, backend="cpu")(b, c)
    np.testing.assert_array_equal(got[0], b * c)
    np.testing.assert_array_equal(got[1], b.T * c)


def test_reshapes_of_equal_sizes_with_other_recipes_are_keyed_apart(rng: np.random.Generator) -> None:
    """A transpose of a ``[2, 2, 5]`` x read as ``[4, 5]`` by literal sizes and by a product of x's own: equal sizes,
    but only the second splits into the blocks ``(2, 2) -> 4`` and ``5 -> 5`` (its index code reads each axis),
    where the first divides the flat offset. Keyed alike, the C backend raised finding their code different (the
    fuzzer's time-major convolution hit it). A reshape's blocks are in its key."""
    x = rng.standard_normal((2, 2, 5))

    def fn(x):
        t = x.permute(1, 0, 2)
        return t.reshape(4, 5) * 2.0, t.reshape(x.shape[1] * x.shape[0], x.shape[2]) * 2.0

    _, keys = _keys(fn, [x])
    assert len(keys) == 2 and keys[0] != keys[1]
    got = nf.compile(fn, backend="cpu")(x)
    for g in got:
        np.testing.assert_array_equal(g, x.transpose(1, 0, 2).reshape(4, 5) * 2.0)
