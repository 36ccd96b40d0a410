"""``elementwise_before_views``: elementwise work on a product read through a view (its rows reshaped, axes of 1
dropped or inserted, a permute) is computed on the product, so the GEMM takes it as its epilogue; and an epilogue
may read its other operands through views (a bias broadcast), only the product's own indices must not move."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

import nnforge as nf
from nnforge.codegen.reference import ReferenceProgram
from nnforge.ir.ops import ELEMENTWISE, Op
from nnforge.nn import Linear
from nnforge.nn.rnn import lstm_layer
from nnforge.passes.reshapes import elementwise_before_views


def _linear_tanh(x, w, b):
    """A linear layer on a ``[T, N, I]`` input as ``nnforge.nn.Linear`` traces it, then an activation."""
    return nf.tanh(nf.nn.functional.linear(x, w, b)) * 2.0


def _args(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(s).astype(np.float32) for s in ((5, 3, 6), (8, 6), (8,))]


def _kernels(fn, backend: str, args: list[np.ndarray]) -> list[str] | None:
    """``fn`` compiled for ``backend``, checked against the reference; the kernel lines of its schedule (None on
    the reference backend, which has none)."""
    got = nf.compile(fn, backend=backend)(*args)
    np.testing.assert_allclose(got, nf.compile(fn)(*args), rtol=1e-5, atol=1e-5)
    if backend == "reference":
        return None
    with contextlib.redirect_stdout(io.StringIO()):
        text = nf.show(nf.compile(fn, backend=backend), *args, stage="scheduled")
    return [line.strip() for line in text.splitlines()[1:] if " -> " in line]


def test_the_rows_of_a_product_take_their_elementwise_work_before_the_reshape(rng: np.random.Generator):
    """tanh(x @ w.T + b) * 2 on a [T, N, I] x: the bias add, tanh and scaling run on the [T * N, H] product and one
    reshape ends the chain; against the traced graph's values."""
    args = _args(rng)

    def rows_reshaped(x, w, b):  # the form the compiled pipeline gives a batched product
        return nf.tanh((x.reshape(15, 6) @ w.T).reshape(5, 3, 8) + b) * 2.0

    graph = nf.compile(rows_reshaped).trace(*args)
    moved = elementwise_before_views(graph)
    work = [n for n in moved.order if n.op in ELEMENTWISE]
    assert work and all(n.ndim == 2 for n in work)
    (out,) = moved.outputs
    assert out.op == Op.RESHAPE and out.srcs[0].op in ELEMENTWISE
    for a, b in zip(ReferenceProgram(moved)(args), ReferenceProgram(graph)(args)):
        np.testing.assert_array_equal(a, b)


def test_a_residual_comes_along_and_work_moving_indices_stays(rng: np.random.Generator):
    """A residual add (another tensor of the reshaped shape, stored or computed: its reshape is a view or inlined
    work) runs on the rows; work on a product reshaped across its last axis, or reading a permuted tensor (whose
    rows reshaped would be a copy), keeps its shape."""
    x, w = rng.standard_normal((4, 3, 6)).astype(np.float32), rng.standard_normal((6, 6)).astype(np.float32)

    def residual(x, w):
        return nf.tanh(x) + (x.reshape(12, 6) @ w).reshape(4, 3, 6) + x

    def across(x, w):
        return (x.reshape(12, 6) @ w).reshape(4, 18) * 2.0

    def permuted(x, w):
        return x.permute(1, 0, 2) + (x.reshape(12, 6) @ w).reshape(3, 4, 6)

    graph = nf.compile(residual).trace(x, w)
    moved = elementwise_before_views(graph)
    adds = [n for n in moved.order if n.op == Op.ADD]
    assert len(adds) == 2 and all(n.ndim == 2 for n in adds)
    np.testing.assert_array_equal(ReferenceProgram(moved)([x, w])[0], ReferenceProgram(graph)([x, w])[0])
    for fn in (across, permuted):
        graph = nf.compile(fn).trace(x, w)
        assert elementwise_before_views(graph) is graph, fn.__name__



def test_work_on_anything_but_a_product_stays(rng: np.random.Generator):
    """Moved onto anything but a product (or work on one), the work would only change shape, and the pointwise
    kernel after it, which does not inline work read through a reshape, would store it separately: an optimizer's
    update of a bias from its gradient's sum ``[1, 1, H]`` read as ``[H]`` stays (it was one kernel more per
    bias in a compiled training step), and so does work on reshaped rows of a sum."""
    g, m = rng.standard_normal((5, 3, 8)).astype(np.float32), rng.standard_normal(8).astype(np.float32)

    def update(g, m):
        return g.sum(axis=(0, 1), keepdims=True).reshape(g.shape[2]) * 0.1 + m * 0.9

    def rows_of_a_sum(g, m):
        return (g.reshape(15, 8) + 1.0).reshape(5, 3, 8) * m

    for fn in (update, rows_of_a_sum):
        graph = nf.compile(fn).trace(g, m)
        assert elementwise_before_views(graph) is graph, fn.__name__

def test_a_linear_layer_and_its_activation_are_one_kernel(backend: str, rng: np.random.Generator):
    """Compiled, the linear layer on a [T, N, I] input with its bias and activation is one GEMM kernel with the
    bias, tanh and scaling as its epilogue, written straight into the result (no copy), on every compiled
    backend; its values agree with the reference."""
    kernels = _kernels(_linear_tanh, backend, _args(rng))
    assert kernels is None or (len(kernels) == 1 and kernels[0].startswith("gemm+add+tanh+mul -> out0")), kernels


def _linear_residual(x, w, b):
    """A linear layer on a ``[T, N, I]`` input and the residual add after it (a transformer's out projection)."""
    return x + nf.nn.functional.linear(x, w, b)


def test_a_linear_layer_and_its_residual_add_are_one_kernel(backend: str, rng: np.random.Generator):
    """The bias and the residual are the GEMM's epilogue, the residual read through its rows' reshape, on every
    compiled backend (before, they were a kernel reading the product back); values agree with the reference."""
    args = [rng.standard_normal(s).astype(np.float32) for s in ((5, 3, 6), (6, 6), (6,))]
    kernels = _kernels(_linear_residual, backend, args)
    assert kernels is None or (len(kernels) == 1 and kernels[0].startswith("gemm+add -> out0")), kernels


def test_an_epilogue_reads_a_computed_bias_through_its_broadcast(rng: np.random.Generator):
    """An LSTM layer with two biases: their sum, broadcast over the rows, is added to the hoisted input
    projection by the GEMM's epilogue (the broadcast's reshape and expand only index the bias; before, "the
    epilogue moves indices" refused it and the add was a kernel writing the [T * N, 4H] array again)."""
    T, N, I, H = 6, 3, 5, 4
    args = [rng.standard_normal(s).astype(np.float32) for s in
            ((T, N, I), (N, H), (N, H), (4 * H, I), (4 * H, H), (4 * H,), (4 * H,))]

    def layer(*a):
        return lstm_layer(*a)[0]

    with contextlib.redirect_stdout(io.StringIO()):
        text = nf.show(nf.compile(layer, backend="cpu"), *args, stage="scheduled")
    assert "gemm+add -> " in text and not any(line.strip().startswith("add -> ") for line in text.splitlines())
    np.testing.assert_allclose(nf.compile(layer, backend="cpu")(*args), nf.compile(layer)(*args), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("width", [16, 48])
def test_a_module_on_a_sequence_compiles_to_the_same_values(width: int, rng: np.random.Generator):
    """``nnforge.nn.Linear`` on a [T, N, I] sequence, then a layer norm over its features: C and reference
    agree."""
    lin = Linear(6, width)
    x = rng.standard_normal((7, 2, 6)).astype(np.float32)

    def fn(x):
        y = lin(x)
        return nf.nn.functional.layer_norm(y + 1.0, (width,))

    np.testing.assert_allclose(nf.compile(fn, backend="cpu")(x), nf.compile(fn)(x), rtol=1e-5, atol=1e-5)


def _conv_silu(x, w, b):
    """A convolution with few output channels (its grouped product ``[N, 1, C, L]`` read as ``[N, C, L]``), then
    swish, as the basecaller's first layers trace."""
    return nf.silu(nf.nn.functional.conv1d(x, w, b, padding=2))


def _conv_args(rng: np.random.Generator, c_in: int) -> list[np.ndarray]:
    return [rng.standard_normal(s).astype(np.float32) for s in ((3, c_in, 20), (4, c_in, 5), (4,))]


@pytest.mark.parametrize("c_in", [1, 3])
def test_work_on_a_product_with_axes_of_one_dropped_moves_onto_the_product(c_in: int, rng: np.random.Generator):
    """The bias add and swish of a convolution run on its product's ``[N, 1, C, L]`` shape, the bias broadcast on
    those axes; one reshape ends the chain. With one input channel that channel count is a symbolic size of value
    1 (the input's), dropped all the same: the reshape keeps the element count, the other axes equal."""
    args = _conv_args(rng, c_in)
    graph = nf.compile(_conv_silu).trace(*args)
    moved = elementwise_before_views(graph)
    (product,) = [n for n in moved.order if n.op == Op.MATMUL]
    work = [n for n in moved.order if n.op in ELEMENTWISE]
    assert work and all(tuple(n.shape) == tuple(product.shape) for n in work)
    (out,) = moved.outputs
    assert out.op == Op.RESHAPE and out.srcs[0].op in ELEMENTWISE
    for a, b in zip(ReferenceProgram(moved)(args), ReferenceProgram(graph)(args)):
        np.testing.assert_array_equal(a, b)


def test_any_operand_comes_along_through_a_reshape_of_axes_of_one(rng: np.random.Generator):
    """A tensor of the reshaped shape (not a broadcast) is read on the product's shape through its own reshape —
    a view of any array — where through a reshape of rows it would have to stay."""
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((5, 6), (6, 7), (1, 5, 7)))

    def fn(a, b, c):
        return nf.tanh((a @ b).unsqueeze(0) + c)

    graph = nf.compile(fn).trace(a, b, c)
    moved = elementwise_before_views(graph)
    assert all(n.ndim == 2 for n in moved.order if n.op in ELEMENTWISE)
    np.testing.assert_array_equal(ReferenceProgram(moved)([a, b, c])[0], ReferenceProgram(graph)([a, b, c])[0])


@pytest.mark.parametrize("c_in", [1, 3])
def test_a_convolution_and_its_activation_are_one_kernel(backend: str, c_in: int, rng: np.random.Generator):
    """Compiled, a convolution with few output channels is its im2col copy and one GEMM kernel whose epilogue is
    the bias and swish (before, the bias and swish were a kernel of their own reading the product back), on every
    compiled backend; its values agree with the reference."""
    kernels = _kernels(_conv_silu, backend, _conv_args(rng, c_in))
    assert kernels is None or (len(kernels) == 2 and kernels[1].startswith("gemm+add+sigmoid+mul -> out0")), kernels



def test_work_on_a_permuted_product_moves_before_the_permute(rng: np.random.Generator):
    """``tanh(permute(reshape(a @ w)) + b)`` with b a per-channel bias: the add and tanh run on the product's rows
    (then its GEMM's epilogue), the permute after them a view its readers index; a permute of anything but a
    product's work stays."""
    a, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((12, 5), (5, 6), (6, 1)))

    def channels_first(a, w, b):
        return nf.tanh((a @ w).reshape(4, 3, 6).permute(1, 2, 0) + b)

    def not_a_product(a, w, b):
        return a.permute(1, 0) * 2.0

    graph = nf.compile(channels_first).trace(a, w, b)
    moved = elementwise_before_views(graph)
    assert all(n.ndim == 2 for n in moved.order if n.op in ELEMENTWISE)
    np.testing.assert_array_equal(ReferenceProgram(moved)([a, w, b])[0], ReferenceProgram(graph)([a, w, b])[0])
    graph = nf.compile(not_a_product).trace(a, w, b)
    assert elementwise_before_views(graph) is graph


def _front_end(x, w, b, w2):
    """A basecaller's front end: a strided convolution to 64 channels (a row per position), swish, the
    time-major permute a recurrent layer reads, and a projection of it."""
    y = nf.silu(nf.nn.functional.conv1d(x, w, b, stride=3, padding=2))
    return y.permute(2, 0, 1) @ w2


def test_a_convolution_feeds_a_time_major_layer_without_a_pass_of_its_own(backend: str, rng: np.random.Generator):
    """The convolution's rows are in time-major order (``nn.functional.conv1d``), its bias and swish its GEMM's
    epilogue and the projection reads the result as it is: the im2col copy and two GEMMs (before: a kernel
    writing the swish in time-major order between them), on every compiled backend; values against the
    reference."""
    args = [rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 16), (64, 3, 5), (64,), (64, 8))]
    kernels = _kernels(_front_end, backend, args)
    assert kernels is None or [k.split(" -> ")[0] for k in kernels][1:] == ["gemm+add+sigmoid+mul", "gemm"], kernels
