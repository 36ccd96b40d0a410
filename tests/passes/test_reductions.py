"""hoist_reductions: accumulating scan carries become one GEMM / sum after the loop."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import nnforge as nf
from nnforge.codegen.c.target import cpu_target
from nnforge.codegen.reference import ReferenceProgram
from nnforge.ir.node import Graph
from nnforge.ir.ops import Op
from nnforge.passes import pipeline, run_pipeline
from nnforge.passes.reductions import hoist_reductions

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "codegen"))
from test_passes import traced
from test_scan import lstm, lstm_args

ZERO = replace(cpu_target(), reduction_hoist_bytes=0)  # every accumulator is worth hoisting


def accumulate(xs, w, acc0, s0, h0, bc0):
    """acc += x_tᵀ @ d_t (an outer product over the batch), s += d_t, and a decaying sum that must stay."""

    def body(carry, x_t):
        acc, s, h, bc = carry
        d = nf.tanh(x_t @ w + h)
        return (acc + x_t.T @ d, s + d, d, bc * 0.5 + d.sum(axis=0)), d

    (acc, s, h, bc), ys = nf.scan(body, (acc0, s0, h0, bc0), xs)
    return acc, s, h, bc, ys


def acc_args(T=5, N=3, P=4, Q=7, dt=np.float64):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(dt) for s in [(T, N, P), (P, Q), (P, Q), (N, Q), (N, Q), (1, Q)]]


def _scans(g: Graph) -> list:
    return [n for n in g.order if n.op == Op.SCAN]


def test_ir_before_and_after():
    g = traced(accumulate, *acc_args())
    (before,) = _scans(g)
    after_g = hoist_reductions(g, ZERO)
    (after,) = _scans(after_g)
    assert before.attrs["n_carry"] == 4 and after.attrs["n_carry"] == 2  # acc and s hoisted; h, bc stay
    body = repr(after.attrs["body"])
    assert body.count("matmul(") == 1  # x_t @ w only: no per-step outer product
    assert "permute(" not in body
    text = repr(after_g)
    tail = text.rsplit("    }\n  }", 1)[1]  # after the scan
    assert "matmul(" in tail and "sum(" in tail and "axes=(0)" in tail  # one GEMM (K = T*N) and one sum
    assert "reshape(" in tail and "shape=(T*3, 7)" in tail  # [T*N, Q]: all steps' d_t as one GEMM operand


@pytest.mark.parametrize("dt", [np.float64, np.float32])
def test_values_unchanged(dt):
    args = acc_args(T=6, N=5, P=3, Q=9, dt=dt)
    g = traced(accumulate, *args)
    want = ReferenceProgram(g)(args)
    got = ReferenceProgram(hoist_reductions(g, ZERO))(args)
    tol = 1e-12 if dt == np.float64 else 1e-4
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_small_carries_stay_in_the_loop():
    g = traced(accumulate, *acc_args())
    # a 4 x 7 outer-product carry of a loop too narrow to split by rows (3 rows) stays hot in cache
    assert hoist_reductions(g, cpu_target()) is g
    assert hoist_reductions(g, replace(cpu_target(), reduction_hoist_bytes=4 * 7 * 8)) is not g


def test_backward_scan_has_no_per_step_weight_gradient_gemm():
    def loss(x, h0, c0, w_ih, w_hh, b):
        return (lstm(x, h0, c0, w_ih, w_hh, b)[0] ** 2).sum()

    args = lstm_args(T=5, N=3, I=7, H=192)  # dW_hh [192, 768] f32: 576 KB, above the half-L2 threshold
    g = run_pipeline(traced(nf.grad(loss, argnums=(3, 4, 5)), *args))
    g = run_pipeline(g, pipeline(cpu_target()))
    (bwd,) = [n for n in _scans(g) if n.attrs["reverse"]]
    body = bwd.attrs["body"]
    assert bwd.attrs["n_carry"] == 2  # dh, dc; dW_ih, dW_hh and db left the loop
    assert sum(n.op == Op.MATMUL for n in body.order) == 1  # dh = dg @ W_hh only
    assert sum(n.op == Op.MATMUL for n in g.order) >= 3  # dW_ih, dW_hh as [H, T*N] @ [T*N, 4H] after the loop


@pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")
@pytest.mark.parametrize("T,N,I,H", [(5, 3, 7, 129), (9, 7, 2, 131), (0, 2, 3, 130)])  # f64 dW_hh > 512 KB
def test_lstm_gradients_cpu_match_reference(T, N, I, H):
    def loss(x, h0, c0, w_ih, w_hh, b):
        ys, h, c = lstm(x, h0, c0, w_ih, w_hh, b)
        return (ys * ys).sum() + (c * h).sum()

    args = lstm_args(T=T, N=N, I=I, H=H, dt=np.float64)
    args[4] *= 0.1  # keep the recurrence tame at this width
    want = nf.compile(nf.grad(loss, argnums=(0, 1, 2, 3, 4, 5)), backend="reference")(*args)
    got = nf.compile(nf.grad(loss, argnums=(0, 1, 2, 3, 4, 5)), backend="cpu")(*args)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("H,N,hoisted", [(128, 16, True), (96, 16, True), (8, 16, True), (96, 8, False)])
def test_small_carries_leave_a_loop_they_keep_from_splitting_by_rows(H, N, hoisted):
    """dW_hh below 512 KB (f32, H = 128: 262 KB, H = 96: 147 KB) leaves the backward scan when that makes the
    scan's batch rows independent (N >= 12), so the CPU backend runs it with the rows split among threads; with
    too few rows to split it stays in the loop."""
    from nnforge.passes.rows import RowSplit, row_split

    def loss(x, h0, c0, w_ih, w_hh, b):
        return (lstm(x, h0, c0, w_ih, w_hh, b)[0] ** 2).sum()

    args = lstm_args(T=3, N=N, I=H, H=H)
    g = run_pipeline(run_pipeline(traced(nf.grad(loss, argnums=(3, 4, 5)), *args)), pipeline(cpu_target()))
    (bwd,) = [n for n in _scans(g) if n.attrs["reverse"]]
    assert (bwd.attrs["n_carry"] == 2) == hoisted
    assert isinstance(row_split(bwd), RowSplit) == hoisted


def test_stacked_layers_keep_one_backward_scan_each(rng: np.random.Generator):
    """Two LSTM layers: the lower layer's backward scan reads the upper one's. Each is rewritten on the already
    rewritten sources, so the graph keeps one backward scan per layer (a new scan built on the old sources kept
    the old upper-layer scan alive: two backward recurrences for that layer), and the gradients still match."""

    def loss(x, h0, c0, w_ih0, w_hh0, b0, w_ih1, w_hh1, b1):
        ys = lstm(x, h0, c0, w_ih0, w_hh0, b0)[0]
        return (lstm(ys, h0, c0, w_ih1, w_hh1, b1)[0] ** 2).sum()

    args = lstm_args(T=4, N=3, I=5, H=5, dt=np.float64)  # I = H: layer 1's weights are shaped like layer 0's
    args += [rng.standard_normal(a.shape) * 0.3 for a in args[3:6]]
    grad = nf.grad(loss, argnums=(3, 4, 5, 6, 7, 8))
    g = run_pipeline(traced(grad, *args))
    after = hoist_reductions(g, ZERO)
    assert len([n for n in _scans(after) if n.attrs["reverse"]]) == 2 == len(
        [n for n in _scans(g) if n.attrs["reverse"]])
    assert all(n.attrs["n_carry"] == 2 for n in _scans(after) if n.attrs["reverse"])  # dh, dc: every dW hoisted
    want = ReferenceProgram(g)(list(args))
    for a, b in zip(ReferenceProgram(after)(list(args)), want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


def accumulate_step_value(xs, w, acc0, h0):
    """acc += (h * x_t)ᵀ @ d_t: the left factor a step value the body computes (a GRU's r * h for its W_hn)."""

    def body(carry, x_t):
        acc, h = carry
        d = nf.tanh(x_t @ w + h)
        v = nf.sigmoid(x_t) * h[:, :x_t.shape[1]]
        return (acc + v.T @ d, d), d

    (acc, h), ys = nf.scan(body, (acc0, h0), xs)
    return acc, h, ys


@pytest.mark.parametrize("dt", [np.float64, np.float32])
def test_a_sum_of_products_of_a_step_value_leaves_the_loop(dt):
    rng = np.random.default_rng(1)
    T, N, P, Q = 6, 5, 3, 7
    args = [rng.standard_normal(s).astype(dt) for s in [(T, N, P), (P, Q), (P, Q), (N, Q)]]
    g = traced(accumulate_step_value, *args)
    after = hoist_reductions(g, ZERO)
    (scan,) = _scans(after)
    assert scan.attrs["n_carry"] == 1  # acc left the loop; v_t and d_t are stacked outputs
    assert sum(n.op == Op.MATMUL for n in scan.attrs["body"].order) == 1  # x_t @ w only
    want = ReferenceProgram(g)(args)
    got = ReferenceProgram(after)(args)
    tol = 1e-12 if dt == np.float64 else 1e-4
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
