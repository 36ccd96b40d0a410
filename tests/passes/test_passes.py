"""Each pass on a small graph: IR text before and after, and the reference giving identical results."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import nnforge as nf
from nnforge.codegen.c.target import cpu_target
from nnforge.compile import trace_function
from nnforge.passes import PIPELINE, cse, dce, hoist, run_pipeline, sigmoid_forms, simplify

sys.path.insert(0, str(Path(__file__).parents[1] / "codegen"))
from test_scan import lstm, lstm_args


def traced(fn, *args):
    cf = nf.compile(fn)
    leaves, treedef, arrays, _ = cf._split(args, {})
    return trace_function(fn, treedef, leaves, arrays)[0]


def body_lines(text: str) -> list[str]:
    return [ln.split(" = ", 1)[1] for ln in text.splitlines() if " = " in ln]


def test_simplify_identities_and_folding():
    def f(x):
        return (x * 1.0 + 0.0) - (nf.full((), 2.0) * 3.0) + x.reshape(2, 3).reshape(6).reshape(2, 3).T.T.sum()

    g = traced(f, np.ones((2, 3), np.float32))
    before, after = repr(g), repr(simplify(g))
    assert "mul(%0" in before and "value=1.0" in before
    ops = body_lines(after)
    assert not any(o.startswith("mul(%0") for o in ops)
    assert any("value=6.0" in o for o in ops)  # 2*3 folded
    assert sum(o.startswith("reshape") for o in ops) <= 1 and not any(o.startswith("permute") for o in ops)


def test_cse_merges_equal_nodes():
    g = traced(lambda x: nf.exp(x) + nf.exp(x), np.ones(3, np.float32))
    assert repr(g).count("exp(") == 2
    assert repr(cse(g)).count("exp(") == 1


def test_dce_drops_unread_nodes():
    g = traced(lambda x: x + 1, np.ones(3, np.float32))
    assert repr(dce(g)) == repr(g)


def test_sigmoid_forms():
    g = traced(lambda x: 1.0 / (1.0 + nf.exp(-x)), np.ones(3, np.float32))
    text = repr(sigmoid_forms(simplify(g)))
    assert "sigmoid(" in text and "exp(" not in text


def test_hoist_premul_lstm():
    g = run_pipeline(traced(lstm, *lstm_args()))
    before = repr(g)
    after = repr(run_pipeline(hoist(g, cpu_target())))
    top_before = [ln for ln in before.splitlines() if ln.startswith("  %") and "matmul" in ln]
    top_after = [ln for ln in after.splitlines() if ln.startswith("  %") and "matmul" in ln]
    inner_after = [ln for ln in after.splitlines() if ln.startswith("      %") and "matmul" in ln]
    assert not top_before and len(top_after) == 1 and len(inner_after) == 1  # x@W_ih left the loop
    from nnforge.ir.dims import free_symbols

    mm = next(n for n in run_pipeline(hoist(g, cpu_target())).order if n.op.name == "MATMUL")
    assert free_symbols(mm.shape[0])  # [T*N, I] @ [I, 4H]: still generic in T


def test_reference_identical_after_pipeline():
    args = lstm_args()
    g = traced(lstm, *args)
    from nnforge.codegen.reference import ReferenceProgram

    a = ReferenceProgram(g)(args)
    b = ReferenceProgram(run_pipeline(g, PIPELINE))(args)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_sums_of_disjoint_zero_pads_become_a_concat(rng: np.random.Generator):
    """The gradient of a tensor read through its four gate slices is a sum of four padded slices: simplify
    turns it into one concat (same values, bit for bit here), and leaves overlapping pads a sum; a concat with
    zeros where a pad has its values is one concat too."""
    from nnforge.codegen.reference import ReferenceProgram

    def gate_grads(z):
        i, f, g, o = z.chunk(4, axis=-1)
        return (nf.sigmoid(i) * nf.tanh(g) + f * 2.0 - o).sum()

    z = rng.standard_normal((5, 16)).astype(np.float32)
    g = traced(nf.grad(gate_grads), z)
    assert "pad(" in repr(g)
    s = run_pipeline(g, PIPELINE)
    ops = body_lines(repr(s))
    assert sum(o.startswith("concat(") for o in ops) == 1 and not any(o.startswith("pad(") for o in ops)
    np.testing.assert_array_equal(ReferenceProgram(g)([z])[0], ReferenceProgram(s)([z])[0])

    def overlapping(x):
        return nf.pad(x[:, :10], ((0, 0), (0, 6))) + nf.pad(x[:, 4:], ((0, 0), (4, 0)))

    ops = body_lines(repr(simplify(traced(overlapping, z))))
    assert any(o.startswith("add(") for o in ops) and not any(o.startswith("concat(") for o in ops)

    def gap(x):  # two pads leaving columns 6..9 empty: a concat with zeros in the gap, then padded
        return nf.pad(x[:, :6], ((0, 0), (0, 10))) + nf.pad(x[:, 10:14], ((0, 0), (10, 2)))

    s = simplify(traced(gap, z))
    ops = body_lines(repr(s))
    assert any(o.startswith("concat(") for o in ops) and not any(o.startswith("add(") for o in ops)
    want = np.zeros_like(z)
    want[:, :6], want[:, 10:14] = z[:, :6], z[:, 10:14]
    np.testing.assert_array_equal(ReferenceProgram(s)([z])[0], want)
    got = nf.compile(gap, backend="cpu")(z) if "cpu" in nf.available_backends() else want
    np.testing.assert_array_equal(got, want)

    def filled(x):  # a concat with zeros where a pad has its values (a GRU's input-projection gradient): one concat
        zeros = nf.zeros((5, 4), dtype=nf.float32)
        return nf.concat([nf.tanh(x[:, :6]), zeros, x[:, 10:]], axis=1) + nf.pad(x[:, 6:10] * 2.0, ((0, 0), (6, 6)))

    s = simplify(traced(filled, z))
    ops = body_lines(repr(s))
    assert sum(o.startswith("concat(") for o in ops) == 1 and not any(o.startswith(("add(", "pad(")) for o in ops)
    joined = np.concatenate([np.tanh(z[:, :6]), z[:, 6:10] * 2.0, z[:, 10:]], axis=1)
    np.testing.assert_allclose(ReferenceProgram(s)([z])[0], joined, rtol=1e-6)


def test_constants_read_by_a_scan_become_constants_of_its_body(rng: np.random.Generator):
    """``1.0 - z`` in a GRU cell traces the 1.0 outside the body; simplify moves it back in (a literal of the
    kernel, not a [N, H] buffer read every step) and drops the scan input; results are unchanged."""
    from nnforge.codegen.reference import ReferenceProgram

    def gru_like(x, h0, w):
        def cell(h, x_t):
            z = nf.sigmoid(x_t + h @ w)
            return (1.0 - z) * h + z * nf.tanh(x_t), h

        return nf.scan(cell, h0, x)

    args = [rng.standard_normal(s).astype(np.float32) for s in [(5, 3, 4), (3, 4), (4, 4)]]
    g = traced(gru_like, *args)
    scan = next(n for n in g.order if n.op.name == "SCAN")
    assert any(m.op.name == "CONST" for m in g.order)  # broadcast outside the body (expand of reshape of it)
    s = simplify(g)
    scan2 = next(n for n in s.order if n.op.name == "SCAN")
    assert not any(m.op.name == "CONST" for m in s.order)
    assert len(scan2.srcs) == len(scan.srcs) - 1
    assert any(m.op.name == "CONST" and m.attrs["value"] == 1.0 for m in scan2.attrs["body"].order)
    for a, b in zip(ReferenceProgram(g)(args), ReferenceProgram(s)(args)):
        np.testing.assert_array_equal(a, b)
    if "cpu" in nf.available_backends():
        for a, b in zip(nf.compile(gru_like, backend="cpu")(*args), ReferenceProgram(g)(args)):
            np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-6)


def test_transposed_weights_enter_scans_as_views(rng: np.random.Generator):
    """``h @ w_hh.T``: after the CPU pipeline the scan reads ``w_hh`` itself and the permute is the matmul's
    operand inside the body (no transposed copy per call); an invariant also read elementwise is left alone."""
    from nnforge.passes import pipeline, views_into_scans

    args = lstm_args(T=5, N=3, I=4, H=6)
    g = run_pipeline(run_pipeline(traced(lstm, *args)), pipeline(cpu_target()))
    scan = next(n for n in g.order if n.op.name == "SCAN")
    w_hh = g.inputs[4]
    assert any(s is w_hh for s in scan.srcs) and not any(s.op.name == "PERMUTE" for s in scan.srcs)
    body = scan.attrs["body"]
    mm = [n for n in body.order if n.op.name == "MATMUL"]
    assert len(mm) == 1 and mm[0].srcs[1].op.name == "PERMUTE" and mm[0].srcs[1].srcs[0].op.name == "INPUT"

    def masked(x, h0, w, m):
        def cell(h, x_t):
            return nf.tanh(x_t + h @ w.T) * m.T, h  # m.T is read element by element

        return nf.scan(cell, h0, x)

    a = [rng.standard_normal(s).astype(np.float32) for s in [(4, 3, 5), (3, 5), (5, 5), (5, 3)]]
    t = traced(masked, *a)
    before = next(n for n in t.order if n.op.name == "SCAN")
    assert sum(s.op.name == "PERMUTE" for s in before.srcs) == 2
    after = next(n for n in views_into_scans(t).order if n.op.name == "SCAN")
    kept = [s for s in after.srcs if s.op.name == "PERMUTE"]
    assert len(kept) == 1 and kept[0].srcs[0] is t.inputs[3] and any(s is t.inputs[2] for s in after.srcs)
    if "cpu" in nf.available_backends():
        want = nf.compile(lstm, backend="reference")(*args)
        for got, w in zip(nf.compile(lstm, backend="cpu")(*args), want):
            np.testing.assert_allclose(got, w, rtol=2e-5, atol=2e-5)
        for got, w in zip(nf.compile(masked, backend="cpu")(*a), nf.compile(masked, backend="reference")(*a)):
            np.testing.assert_allclose(got, w, rtol=2e-5, atol=2e-5)


def test_broadcast_bias_enters_scans_as_a_view(rng: np.random.Generator):
    """``... + b`` in a cell traces ``expand(reshape(b))`` outside the body; the scan must then read an ``[N, G]``
    array, materialized every call. After the CPU pipeline it reads ``b`` itself and the broadcast is inside the
    body (an index expression); results as the reference backend's."""
    from nnforge.passes import pipeline

    def cell_with_bias(x, h0, w, b):
        def cell(h, x_t):
            h = nf.tanh(h @ w.T + b) + x_t  # b stays in the loop (not hoisted with a premultiplied input)
            return h, h

        return nf.scan(cell, h0, x)

    a = [rng.standard_normal(s).astype(np.float32) for s in [(4, 3, 6), (3, 6), (6, 6), (6,)]]
    t = traced(cell_with_bias, *a)
    before = next(n for n in t.order if n.op.name == "SCAN")
    assert any(s.op.name == "EXPAND" for s in before.srcs)
    g = run_pipeline(run_pipeline(t), pipeline(cpu_target()))
    scan = next(n for n in g.order if n.op.name == "SCAN")
    assert not any(s.op.name == "EXPAND" for s in scan.srcs) and any(s is g.inputs[3] for s in scan.srcs)
    body = scan.attrs["body"]
    assert any(n.op.name == "EXPAND" and n.srcs[0].op.name == "RESHAPE" for n in body.order)
    if "cpu" in nf.available_backends():
        want = nf.compile(cell_with_bias, backend="reference")(*a)
        for got, w in zip(nf.compile(cell_with_bias, backend="cpu")(*a), want):
            np.testing.assert_allclose(got, w, rtol=2e-5, atol=2e-5)
