"""sink_output_products: a scan's stacked products of a step value with a loop invariant become one GEMM after it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import nnforge as nf
from nnforge.codegen.reference import ReferenceProgram
from nnforge.ir.node import Graph
from nnforge.ir.ops import Op
from nnforge.passes import pipeline, run_pipeline
from nnforge.passes.sinks import sink_output_products

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "codegen"))
from test_passes import traced
from test_scan import lstm, lstm_args


def projected(xs, h0, w, v, u):
    """h_t = tanh(x_t @ w + h @ u); stacked: h_t @ v, h_t @ vᵀ (v square), h_t itself, and h_t @ u, whose u the
    recurrence reads too; and one product read again in the body (it feeds the carry), which must stay."""

    def body(h, x_t):
        h = nf.tanh(x_t @ w + h @ u)
        kept = h @ v
        return h + 0.1 * nf.tanh(kept), (h @ v, h @ v.T, h, h @ u, kept)

    return nf.scan(body, h0, xs)


def _args(rng: np.random.Generator, T=5, N=3, I=4, H=6, dt=np.float64):
    return [rng.standard_normal(s).astype(dt) * 0.5 for s in [(T, N, I), (N, H), (I, H), (H, H), (H, H)]]


def _scan(g: Graph):
    (s,) = [n for n in g.order if n.op == Op.SCAN]
    return s


def test_products_with_invariants_leave_the_loop_and_the_values_stay(rng: np.random.Generator):
    args = _args(rng)
    g = traced(projected, *args)
    after = sink_output_products(g)
    before_body, body = _scan(g).attrs["body"], _scan(after).attrs["body"]
    # h @ v, h @ vᵀ and h @ u (stacked) computed after the loop; x @ w, h @ u (recurrence) and the kept one stay
    assert sum(n.op == Op.MATMUL for n in before_body.order) == 6
    assert sum(n.op == Op.MATMUL for n in body.order) == 3
    assert sum(n.op == Op.MATMUL for n in after.order) == 3
    want = ReferenceProgram(g)(args)
    got = ReferenceProgram(after)(args)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_a_scan_without_such_products_is_left_as_it_is(rng: np.random.Generator):
    def f(xs, h0, w):
        def body(h, x_t):
            h = nf.tanh(x_t @ w + h)
            return h, h * 2.0  # no product among the stacked outputs

        return nf.scan(body, h0, xs)

    g = traced(f, rng.standard_normal((4, 3, 5)), rng.standard_normal((3, 5)), rng.standard_normal((5, 5)))
    assert sink_output_products(g) is g


def _stack_grad():
    def loss(x, h0, c0, *ws):
        ys = lstm(x, h0, c0, *ws[:3])[0]
        return (lstm(ys, h0, c0, *ws[3:])[0] ** 2).sum()

    return nf.grad(loss, argnums=tuple(range(0, 9)))


def test_a_stacked_lstm_backward_reads_only_its_recurrent_weights(rng: np.random.Generator):
    """The upper layer's backward computed ``dx_t = dg_t @ W_ih`` every step, reading W_ih beside W_hh: on the
    GPU the two did not fit one persistent program at H = 96 in float16, and its backward ran as a host loop.
    Now the dx of every step is one GEMM after the loop and each backward scan reads one weight matrix."""
    from nnforge.codegen.triton import triton_target

    args = lstm_args(T=3, N=4, I=96, H=96, dt=np.float16)
    args += [a.copy() for a in args[3:6]]
    g = run_pipeline(run_pipeline(traced(_stack_grad(), *args)), pipeline(triton_target()))
    backward = [n for n in g.order if n.op == Op.SCAN and n.attrs["reverse"]]
    assert len(backward) == 2
    for scan in backward:
        body = scan.attrs["body"]
        products = [n for n in body.order if n.op == Op.MATMUL]
        assert len(products) == 1, [n.loc for n in products]  # dh = dg @ W_hh only


def test_stacked_lstm_gradients_match_the_unoptimized_graph(backend: str, rng: np.random.Generator):
    """Every backend's gradients of a two-layer stack (its pipeline sinks the upper layer's dx) against the traced
    graph before the backend's passes, on the reference interpreter."""
    args = lstm_args(T=5, N=4, I=6, H=6, dt=np.float64)
    args += [rng.standard_normal(a.shape) * 0.3 for a in args[3:6]]
    want = ReferenceProgram(traced(_stack_grad(), *args))(args)
    got = nf.compile(_stack_grad(), backend=backend)(*args)
    assert len(got) == len(want) == 9
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
