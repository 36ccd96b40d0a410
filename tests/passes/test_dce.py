"""DCE removes stacked scan outputs nobody reads, and the body work behind them, and reads a stacked output that
stacks the same body node as an earlier one from the earlier one."""

from __future__ import annotations

import numpy as np

import nnforge as nf
from nnforge.ir.ops import Op
from nnforge.passes.dce import dce


def _scan_nodes(graph):
    return [n for n in graph.order if n.op == Op.SCAN]


def test_unread_ys_and_their_body_work_are_dropped(rng: np.random.Generator):
    def f(x, w):
        def cell(h, x_t):
            h = nf.tanh(x_t @ w + h)
            return h, (h, nf.exp(h) * 3.0)  # the second output is never read

        h, (ys, _unused) = nf.scan(cell, nf.zeros(x.shape[1], w.shape[1]), x)
        return ys.sum(0) + h

    x = rng.standard_normal((5, 2, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3)).astype(np.float32)
    traced = nf.compile(f).trace(x, w)
    from nnforge.compile import CompiledFunction, trace_function

    cf = CompiledFunction(f)
    leaves, treedef, arrays, _ = cf._split((x, w), {})
    raw = trace_function(f, treedef, leaves, arrays).graph
    (before,) = _scan_nodes(raw)
    after = _scan_nodes(dce(raw))[0]
    assert len(before.types) == 3 and len(after.types) == 2
    assert any(m.op == Op.EXP for m in before.attrs["body"].order)
    assert not any(m.op == Op.EXP for m in after.attrs["body"].order)
    assert len(_scan_nodes(traced)[0].types) == 2  # the pipeline runs it
    ref = np.zeros((2, 3), np.float32)
    acc = np.zeros((2, 3), np.float32)
    for t in range(5):
        ref = np.tanh(x[t] @ w + ref)
        acc += ref
    np.testing.assert_allclose(nf.compile(f)(x, w), acc + ref, rtol=1e-5, atol=1e-6)


def test_graph_without_dead_loop_outputs_is_returned_unchanged(rng: np.random.Generator):
    def f(x):
        return nf.scan(lambda c, x_t: (c + x_t, c * 2), nf.zeros(2), x)

    x = rng.standard_normal((4, 2)).astype(np.float32)
    graph = nf.compile(f).trace(x)
    assert dce(graph) is graph


def test_a_stacked_output_stacking_the_same_node_again_is_read_from_the_first(rng: np.random.Generator,
                                                                               backend: str) -> None:
    def f(x, w):
        def cell(h, x_t):
            h = nf.tanh(x_t @ w + h)
            g = h * 2.0
            return h, (g, h, g)  # the third output is the first again

        h, (a, b, c) = nf.scan(cell, nf.zeros(x.shape[1], w.shape[1]), x)
        return a.sum(0) * c.sum(0) + b.sum(0) + c[0] + h

    x = rng.standard_normal((5, 2, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3)).astype(np.float32)
    (scan,) = _scan_nodes(nf.compile(f).trace(x, w))
    assert len(scan.types) == 3  # h, and the two different stacked outputs
    h = np.zeros((2, 3), np.float32)
    gs, hs = [], []
    for t in range(5):
        h = np.tanh(x[t] @ w + h)
        gs.append(h * 2.0)
        hs.append(h)
    want = np.sum(gs, 0) * np.sum(gs, 0) + np.sum(hs, 0) + gs[0] + h
    np.testing.assert_allclose(nf.compile(f, backend=backend)(x, w), want, rtol=1e-5, atol=1e-5)



def test_stepped_inputs_and_constants_the_body_no_longer_reads_are_dropped(rng: np.random.Generator,
                                                                           backend: str) -> None:
    """Dropping an unread stacked output leaves its inputs unread: the scan stops taking the second sequence and
    the scale (no slice of it per step, no [T, ...] array kept alive for it); the results do not change."""
    def f(x, y, w, s):
        def cell(h, xy):
            x_t, y_t = xy
            h = nf.tanh(x_t @ w + h)
            return h, (h, y_t * s)  # the second output is never read

        h, (ys, _unused) = nf.scan(cell, nf.zeros(x.shape[1], w.shape[1]), (x, y))
        return ys.sum(0) + h

    x, y = (rng.standard_normal((5, 2, 3)).astype(np.float32) for _ in range(2))
    w, s = rng.standard_normal((3, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    (scan,) = _scan_nodes(nf.compile(f).trace(x, y, w, s))
    assert scan.attrs["n_xs"] == 1 and len(scan.srcs) == 1 + 1 + 1  # h0, x, w
    assert len(scan.attrs["body"].inputs) == len(scan.srcs)
    h, acc = np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32)
    for t in range(5):
        h = np.tanh(x[t] @ w + h)
        acc += h
    np.testing.assert_allclose(nf.compile(f, backend=backend)(x, y, w, s), acc + h, rtol=1e-5, atol=1e-5)
