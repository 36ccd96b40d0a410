"""nf.scan: forward and gradients against the same function unrolled in Python and against torch autograd.

Tests of values and gradients run on every backend (the ``backend`` fixture): eagerly on the reference interpreter,
compiled (``tests/core/compiled.py``) on the others, against the same torch (or unrolled) results. Tests of the
traced structure or of trace-time errors have no backend and run once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nnforge as nf
from nnforge.ir.ops import Op

from .compiled import expect_fallback, on_backend, skip_where_unrunnable
from .scan_util import py_scan
from .utils import assert_close, to_torch

T, N, I, H = 6, 2, 3, 4


def compare(model, arrays, n_diff, backend, rtol=1e-9):
    """``model(scan, *tensors) -> scalar`` with nf.scan on ``backend``, unrolled nf (eager), and unrolled torch:
    values and gradients. All float64: the compiled C code keeps the float64 tolerance (a few ulps apart).

    The first ``n_diff`` arrays are differentiated; the rest (projections, masks) are constants.
    """
    argnums = tuple(range(n_diff))
    v_scan, g_scan = on_backend(nf.value_and_grad(lambda *a: model(nf.scan, *a), argnums), backend)(*arrays)
    v_unr, g_unr = nf.value_and_grad(lambda *a: model(py_scan, *a), argnums)(*arrays)
    tt = [to_torch(a, requires_grad=i < n_diff) for i, a in enumerate(arrays)]
    v_t = model(py_scan, *tt)
    v_t.backward()
    assert_close(v_scan, v_unr, rtol=rtol, atol=rtol, what="value: scan vs unrolled")
    assert_close(v_scan, v_t, rtol=rtol, atol=rtol, what="value: scan vs torch")
    for i in argnums:
        assert np.abs(g_scan[i]).max() > 0, f"gradient {i} is identically zero: the test would prove nothing"
        assert_close(g_scan[i], g_unr[i], rtol=rtol, atol=rtol, what=f"grad {i}: scan vs unrolled")
        assert_close(g_scan[i], tt[i].grad, rtol=rtol, atol=rtol, what=f"grad {i}: scan vs torch")
    return v_scan, g_scan


def _sigmoid(x):
    return x.sigmoid()


# ---- RNN and LSTM ---------------------------------------------------------------------------------------------
def rnn_model(scan, xs, h0, w_ih, w_hh, b, ry, rh, reverse=False, **kw):
    def cell(h, x_t):
        h = (x_t @ w_ih.T + h @ w_hh.T + b).tanh()
        return h, h * 2

    h, ys = scan(cell, h0, xs, reverse=reverse, **kw)
    return (ys * ry).sum() + (h * rh).sum()


def rnn_arrays(r):
    return [r.standard_normal(s) * sc for s, sc in
            [((T, N, I), 1), ((N, H), 1), ((H, I), 0.5), ((H, H), 0.5), ((H,), 0.1), ((T, N, H), 1), ((N, H), 1)]]


@pytest.mark.parametrize("reverse", [False, True])
def test_rnn_grad_equals_unrolled_and_torch(reverse, backend, rng):
    compare(lambda scan, *a: rnn_model(scan, *a, reverse=reverse), rnn_arrays(rng), n_diff=5, backend=backend)


def lstm_model(scan, xs, h0, c0, w_ih, w_hh, b, ry, rc):
    def cell(carry, x_t):
        h, c = carry
        i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, -1)
        c = _sigmoid(f) * c + _sigmoid(i) * g.tanh()
        h = _sigmoid(o) * c.tanh()
        return (h, c), h

    (h, c), ys = scan(cell, (h0, c0), xs)
    return (ys * ry).sum() + (c * rc).sum() + h.sum()


def lstm_arrays(r):
    return [r.standard_normal(s) * sc for s, sc in
            [((T, N, I), 1), ((N, H), 1), ((N, H), 1), ((4 * H, I), 0.4), ((4 * H, H), 0.4), ((4 * H,), 0.1),
             ((T, N, H), 1), ((N, H), 1)]]


def test_lstm_grad_equals_unrolled_and_torch(backend, rng):
    compare(lstm_model, lstm_arrays(rng), n_diff=6, backend=backend)


def peephole_lstm_model(scan, xs, h0, c0, w_ih, w_hh, b, p, ry, rc):
    """Peepholes (Gers and Schmidhuber): the input and forget gates see c, the output gate the new c."""
    p_i, p_f, p_o = p.chunk(3, -1)

    def cell(carry, x_t):
        h, c = carry
        i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, -1)
        c = _sigmoid(f + p_f * c) * c + _sigmoid(i + p_i * c) * g.tanh()
        h = _sigmoid(o + p_o * c) * c.tanh()
        return (h, c), h

    (h, c), ys = scan(cell, (h0, c0), xs)
    return (ys * ry).sum() + (c * rc).sum() + h.sum()


def test_peephole_lstm_grad_equals_unrolled_and_torch(backend, rng):
    arrays = [rng.standard_normal(s) * sc for s, sc in
              [((T, N, I), 1), ((N, H), 1), ((N, H), 1), ((4 * H, I), 0.4), ((4 * H, H), 0.4), ((4 * H,), 0.1),
               ((3 * H,), 0.5), ((T, N, H), 1), ((N, H), 1)]]
    compare(peephole_lstm_model, arrays, n_diff=7, backend=backend)


def test_lstm_matches_torch_lstm_module(backend, rng):
    """The scan LSTM cell against torch.nn.LSTM itself (same gate order i, f, g, o)."""
    r = rng
    torch.manual_seed(int(r.integers(2 ** 31)))  # the module's initial weights, from the test's generator too
    lstm = torch.nn.LSTM(I, H).double()
    xs, h0, c0 = r.standard_normal((T, N, I)), r.standard_normal((N, H)), r.standard_normal((N, H))
    ys_t, (h_t, c_t) = lstm(to_torch(xs), (to_torch(h0)[None], to_torch(c0)[None]))
    p = {k: v.detach().numpy() for k, v in lstm.named_parameters()}

    def cell(carry, x_t):
        h, c = carry
        i, f, g, o = (x_t @ p["weight_ih_l0"].T + h @ p["weight_hh_l0"].T + p["bias_ih_l0"] + p["bias_hh_l0"]).chunk(
            4, -1)
        c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        h = o.sigmoid() * c.tanh()
        return (h, c), h

    def run(h0, c0, xs):
        (h, c), ys = nf.scan(cell, (h0, c0), xs)
        return h, c, ys

    h, c, ys = on_backend(run, backend)(*(nf.tensor(a) if backend == "reference" else a for a in (h0, c0, xs)))
    assert_close(ys, ys_t, "float64")
    assert_close(h, h_t[0], "float64")
    assert_close(c, c_t[0], "float64")


# ---- pytrees --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["tuple", "list", "dict", "nested"])
def test_pytree_carry_and_ys(kind, backend, rng):
    def pack(a, b):
        return {"tuple": (a, b), "list": [a, b], "dict": {"b": b, "a": a}, "nested": (a, {"inner": [b]})}[kind]

    def unpack(c):
        return {"tuple": lambda: c, "list": lambda: c, "dict": lambda: (c["a"], c["b"]),
                "nested": lambda: (c[0], c[1]["inner"][0])}[kind]()

    def model(scan, xs_a, xs_b, a0, b0, w):
        def body(carry, x):
            a, b = unpack(carry)
            xa, xb = unpack(x)
            a2 = (a * w + xa).tanh()
            b2 = b * 0.9 + (a2 @ xb)
            return pack(a2, b2), pack(a2.sum(-1), b2 * b2)

        carry, ys = scan(body, pack(a0, b0), pack(xs_a, xs_b))
        (a, b), (ya, yb) = unpack(carry), unpack(ys)
        assert type(carry) is type(pack(a0, b0)) and type(ys) is type(pack(a0, b0))
        return a.sum() + (b * b).sum() + (ya * ya).sum() + yb.sum()

    r = rng
    arrays = [r.standard_normal((T, 3)), r.standard_normal((T, 3, 2)), r.standard_normal(3), r.standard_normal(2),
              r.standard_normal(3)]
    compare(model, arrays, n_diff=5, backend=backend)


def test_ys_none_and_several_xs(backend, rng):
    def body(c, x):
        a, b = x
        return c * a + b, None

    def run(c0, a, b):
        c, ys = nf.scan(body, c0, (a, b))
        assert ys is None
        return c

    c0, a, b = rng.standard_normal(()), rng.standard_normal(4), rng.standard_normal(4)
    c = on_backend(run, backend)(*(nf.tensor(v) if backend == "reference" else v for v in (c0, a, b)))
    expected = c0
    for t in range(4):
        expected = expected * a[t] + b[t]
    assert_close(c, expected, "float64")


# ---- reverse, length, empty -----------------------------------------------------------------------------------
@pytest.mark.parametrize("reverse", [False, True])
def test_reverse_keeps_ys_in_input_order(reverse, backend, rng):
    x = rng.integers(1, 10, 5) * rng.choice([-1.0, 1.0], 5)  # nonzero integers: every partial sum is exact
    c0 = float(rng.integers(1, 10))

    def run(c0, x):
        return nf.scan(lambda c, x_t: (c + x_t, c + x_t), c0, x, reverse=reverse)

    c, ys = on_backend(run, backend)(*(nf.tensor(v) if backend == "reference" else v for v in (np.array(c0), x)))
    expected = c0 + (np.cumsum(x[::-1])[::-1] if reverse else np.cumsum(x))
    np.testing.assert_array_equal(np.asarray(ys), expected)
    assert float(np.asarray(c)) == c0 + x.sum()


def test_length_without_xs_forward_and_grad(backend, rng):
    """A power iteration: no xs, the trip count comes from ``length=``; grads w.r.t. the closed-over matrix."""

    def model(scan, m, v0, r):
        def step(v, _):
            w = m @ v
            return w / (w * w).sum().sqrt(), (w * r).sum()

        v, ys = scan(step, v0, None, length=7)
        return v.sum() + ys.sum()

    r = rng
    compare(model, [r.standard_normal((4, 4)), r.standard_normal(4), r.standard_normal(4)], n_diff=2, backend=backend)


def test_length_and_xs_must_agree():
    with pytest.raises(nf.ShapeError, match="length=3"):
        nf.scan(lambda c, x: (c, x), nf.zeros(2), nf.zeros(5, 2), length=3)


def test_length_one_and_zero(backend, rng):
    w, init, x1 = rng.standard_normal(2), rng.standard_normal(2), rng.standard_normal((1, 2))

    def run(init, xs):
        return nf.scan(lambda c, x: (c * nf.tensor(w) + x, c), init, xs)

    fn = on_backend(run, backend)
    wrap = nf.tensor if backend == "reference" else np.asarray
    c, ys = fn(wrap(init), wrap(x1))
    assert_close(c, init * w + x1[0], "float64")  # the C compiler may fuse the multiply-add: not bit-exact
    np.testing.assert_array_equal(np.asarray(ys), init[None])
    c0, ys0 = fn(wrap(init), wrap(x1[:0]))
    np.testing.assert_array_equal(np.asarray(c0), init)
    assert np.asarray(ys0).shape == (0, 2)


def test_int_carry_alongside_float_carry(backend, rng):
    def model(scan, xs, h0, w):
        def body(carry, x):
            h, k = carry
            return ((h * w + x).tanh(), k + 1), h * (k + 1)

        (h, k), ys = scan(body, (h0, nf.tensor(0) if scan is nf.scan or isinstance(h0, nf.Tensor)
                                 else torch.tensor(0)), xs)
        return h.sum() + ys.sum() + k * 0.0

    r = rng
    compare(model, [r.standard_normal((T, 3)), r.standard_normal(3), r.standard_normal(3)], n_diff=3, backend=backend)


# ---- nesting --------------------------------------------------------------------------------------------------
def nested_model(scan, xs, h0, w, u, r):
    """Outer scan over time; its body runs an inner scan over the feature chunks of x_t, closing over the carry."""

    def outer(h, x_t):  # x_t: [K, D]
        def inner(acc, x_k):
            acc = (acc @ u + x_k * h).tanh()
            return acc, acc.sum()

        acc, s = scan(inner, h * 0.5, x_t)
        h = (h @ w).tanh() + acc
        return h, s

    h, ys = scan(outer, h0, xs)
    return (h * h).sum() + (ys * r).sum()


def test_nested_scan_forward_and_grad(backend, rng):
    r = rng
    arrays = [r.standard_normal((5, 3, 4)), r.standard_normal(4), r.standard_normal((4, 4)) * 0.5,
              r.standard_normal((4, 4)) * 0.5, r.standard_normal((5, 3))]
    compare(nested_model, arrays, n_diff=4, backend=backend)


def test_nested_scan_stays_nested_in_ir(rng):
    r = rng
    arrays = [r.standard_normal((5, 3, 4)), r.standard_normal(4), r.standard_normal((4, 4)),
              r.standard_normal((4, 4)), r.standard_normal((5, 3))]
    graph = nf.compile(lambda *a: nested_model(nf.scan, *a)).trace(*arrays)
    outer = [n for n in graph.order if n.op == Op.SCAN]
    assert len(outer) == 1
    inner = [n for n in outer[0].attrs["body"].order if n.op == Op.SCAN]
    assert len(inner) == 1


# ---- checkpointing --------------------------------------------------------------------------------------------
def _args(backend, *arrays):
    """A compiled function's arguments: numpy arrays compiled, tensors eagerly (nf.scan takes tensors)."""
    return [nf.tensor(a) if backend == "reference" else a for a in arrays]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6, 7, 10, 16])
def test_checkpoint_every_gives_same_values_and_grads(k, reverse, backend, rng):
    """T=10: k in {2, 5, 10} divides it, {3, 4, 6, 7} do not, 16 exceeds it. The checkpointed scan runs on
    ``backend`` (compiled: one program for its values, gradients and ys); the plain scan it must equal runs
    eagerly on the reference interpreter (compiling that too would double the C build, ~1 s per case)."""
    r = rng
    arrays = [r.standard_normal((10, N, I)), r.standard_normal((N, H)), r.standard_normal((H, I)) * 0.5,
              r.standard_normal((H, H)) * 0.5, r.standard_normal(H), r.standard_normal((10, N, H)),
              r.standard_normal((N, H))]

    def run(*arrays, **kw):
        value_and_grad = nf.value_and_grad(lambda *a: rnn_model(nf.scan, *a, reverse=reverse, **kw), tuple(range(5)))
        # ys themselves, not just a projection of them
        xs, h0, w_ih, w_hh, b = arrays[:5]

        def cell(h, x_t):
            h = (x_t @ w_ih.T + h @ w_hh.T + b).tanh()
            return h, h

        return value_and_grad(*arrays), nf.scan(cell, h0, xs, reverse=reverse, **kw)

    (v0, g0), (h_a, ys_a) = run(*_args("reference", *arrays))
    (v1, g1), (h_b, ys_b) = on_backend(lambda *a: run(*a, checkpoint_every=k), backend)(*_args(backend, *arrays))
    assert_close(v1, v0, rtol=1e-12, atol=1e-12, what="value")
    assert len(g1) == len(g0) == 5
    for a, b in zip(g1, g0):
        assert_close(a, b, rtol=1e-12, atol=1e-12, what="grad")
    assert tuple(ys_b.shape) == (10, N, H)
    # Compiled, the sums feeding tanh are reassociated (and fused multiply-adds): a few ulps of the output scale
    # (|tanh| <= 1) apart, so atol is scaled by it (``assert_close``); one backend alone agrees to the bit.
    assert_close(ys_b, ys_a, rtol=1e-13, atol=1e-13, what="ys")
    assert_close(h_b, h_a, rtol=1e-13, atol=1e-13, what="final carry")


def test_checkpoint_every_with_pytree_carry(backend, rng):
    r = rng
    arrays = [r.standard_normal((7, N, I)), r.standard_normal((N, H)), r.standard_normal((N, H)),
              r.standard_normal((4 * H, I)) * 0.4, r.standard_normal((4 * H, H)) * 0.4, r.standard_normal(4 * H),
              r.standard_normal((7, N, H)), r.standard_normal((N, H))]

    def ck_scan(body, init, xs, **kw):
        return nf.scan(body, init, xs, checkpoint_every=3, **kw)

    g0 = nf.grad(lambda *a: lstm_model(nf.scan, *a), tuple(range(6)))(*arrays)  # plain: eagerly, as above
    g1 = on_backend(nf.grad(lambda *a: lstm_model(ck_scan, *a), tuple(range(6))), backend)(*arrays)
    assert len(g1) == len(g0) == 6
    for a, b in zip(g1, g0):
        assert_close(a, b, rtol=1e-12, atol=1e-12)


# ---- gradient accumulation ------------------------------------------------------------------------------------
def test_value_used_many_times_accumulates(backend, rng):
    """w is read three times per step and once outside; h0 is the init and also in the loss; xs in and out."""

    def model(scan, xs, h0, w):
        def body(h, x):
            h2 = (h * w + x * w).tanh() * w
            return h2, (h2 * x).sum()

        h, ys = scan(body, h0, xs)
        return h.sum() + ys.sum() + (w * h0).sum() + (xs * xs).sum() + (h0 * h0).sum()

    r = rng
    compare(model, [r.standard_normal((T, 3)), r.standard_normal(3), r.standard_normal(3)], n_diff=3, backend=backend)


def test_same_scan_output_used_twice_and_two_scans_share_weights(backend, rng):
    def model(scan, xs, h0, w):
        def body(h, x):
            h = (h @ w + x).tanh()
            return h, h

        h1, ys1 = scan(body, h0, xs)
        h2, ys2 = scan(body, h1, ys1)  # a second scan reading the first one's results
        return (ys1 * ys2).sum() + (h1 * h2).sum() + ys1.sum()

    r = rng
    compare(model, [r.standard_normal((T, 3)), r.standard_normal(3), r.standard_normal((3, 3)) * 0.5], n_diff=3,
            backend=backend)


def test_closed_over_parameter_backward_accumulates_into_grad(backend, rng):
    """``backward`` fills the ``.grad`` of a parameter the scan body closes over. Compiled, the function calls
    ``backward`` itself and returns ``w.grad`` (a compiled call does not write ``.grad`` back)."""
    r = rng
    w_np, xs_np, h0_np = r.standard_normal((3, 3)) * 0.5, r.standard_normal((T, 3)), r.standard_normal(3)
    w = nf.tensor(w_np, requires_grad=True)

    def step(h0, xs):
        def body(h, x):
            h = (h @ w + x).tanh()
            return h, h

        _, ys = nf.scan(body, h0, xs)
        (ys * ys).sum().backward()
        assert w.grad is not None
        return w.grad

    w_grad = on_backend(step, backend)(*_args(backend, h0_np, xs_np))

    wt = to_torch(w_np, requires_grad=True)
    _, ys_t = py_scan(lambda h, x: ((h @ wt + x).tanh(),) * 2, to_torch(h0_np), to_torch(xs_np))
    (ys_t * ys_t).sum().backward()
    assert_close(w_grad, wt.grad, "float64", grad=True)


def test_grad_with_respect_to_xs_only(backend, rng):
    def model(scan, xs, h0, w):
        return scan(lambda h, x: ((h * w + x).sin(), h * x), h0, xs)[1].sum()

    r = rng
    compare(model, [r.standard_normal((T, 3)), r.standard_normal(3), r.standard_normal(3)], n_diff=1, backend=backend)


@pytest.mark.parametrize("product", [False, True])
def test_second_order_grad_through_scan(product, backend, rng):
    """grad of (grad through a scan) against torch double backward; with ``product`` the step multiplies its carry
    by a matrix, whose saved value (``h @ w``) the backward step reads: the second derivative still flows."""
    r = rng
    if product:
        xs, h0, w = r.standard_normal((5, 2, 3)), r.standard_normal((2, 3)), r.standard_normal((3, 3)) * 0.5
    else:
        xs, h0, w = r.standard_normal((4, 3)), r.standard_normal(3), r.standard_normal(3)

    def loss(scan, w, xs, h0):
        h, ys = scan(lambda h, x: ((((h @ w) if product else (h * w)) + x).tanh(), h), h0, xs)
        return (ys * ys).sum() + h.sum()

    def gnorm(w):
        g = nf.grad(lambda w_: loss(nf.scan, w_, nf.tensor(xs), nf.tensor(h0)))(w)
        return (g * g).sum()

    g2 = on_backend(nf.grad(gnorm), backend)(w)
    wt = to_torch(w, requires_grad=True)
    (gt,) = torch.autograd.grad(loss(py_scan, wt, to_torch(xs), to_torch(h0)), wt, create_graph=True)
    (g2t,) = torch.autograd.grad((gt * gt).sum(), wt)
    assert np.abs(g2t.numpy()).max() > 0
    assert_close(g2, g2t, "float64", grad=True)


def test_backward_step_reads_the_saved_gate_sums(rng):
    """The forward scan stacks each step's gate pre-activations ``x_t @ W_ih.T + h @ W_hh.T + b`` (the sum the
    carry's product is the sole term of); the backward body reads them and neither multiplies the saved h to
    recompute the gates (only for dW_hh, through a transpose) nor reads the input projection again."""
    arrays = lstm_arrays(rng)
    graph = nf.compile(nf.grad(lambda *a: lstm_model(nf.scan, *a), tuple(range(6)))).trace(*arrays)
    forward, backward = sorted((n for n in graph.order if n.op == Op.SCAN), key=lambda n: n.attrs["reverse"])
    fbody = forward.attrs["body"]

    def terms(v):
        return [t for s in v.srcs for t in terms(s)] if v.op == Op.ADD else [v]

    sums = [o for o in fbody.outputs if o.op == Op.ADD and o.shape == (N, 4 * H)]
    assert len(sums) == 1
    products = [t for t in terms(sums[0]) if t.op == Op.MATMUL and t.srcs[0] is fbody.inputs[0]]  # h @ W_hh.T
    assert len(products) == 1
    assert not [o for o in fbody.outputs if o.op == Op.MATMUL]
    body = backward.attrs["body"]
    saved_h = body.inputs[backward.attrs["n_carry"]]
    assert not [m for m in body.order if m.op == Op.MATMUL and m.srcs[0] is saved_h]
    nc, nx = backward.attrs["n_carry"], backward.attrs["n_xs"]
    assert [s.shape for s in backward.srcs[nc:nc + nx]].count((T, N, 4 * H)) == 1  # the sums, not the projection


# The C backend has no half precision: there a float16/bfloat16 scan runs on the interpreter (skipped, with why).
_HALVES = ("float16", "bfloat16")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_scan_in_reduced_precision_matches_torch_in_the_same_dtype(dtype, backend, rng):
    """float32 keeps the table's float32 tolerance compiled too: the C backend's float32 tanh (vector form within
    4e-7 relative) and reassociated sums stay ~100 ulps inside 1e-5."""
    skip_where_unrunnable(backend, dtype)
    r = rng
    xs, w, h0 = r.standard_normal((8, 3)), r.standard_normal(3), r.standard_normal(3)

    def run(h0, xs):
        return nf.scan(lambda h, x: ((h * nf.tensor(w).cast(dtype) + x).tanh(), h * x),
                       h0.cast(dtype), xs.cast(dtype))

    td = getattr(torch, dtype)
    tw, th, tx = to_torch(w).to(td), to_torch(h0).to(td), to_torch(xs).to(td)
    th_final, tys = py_scan(lambda h, x: ((h * tw + x).tanh(), h * x), th, tx)

    def check():
        c, ys = on_backend(run, backend)(*_args(backend, h0, xs))
        if backend == "reference":
            assert c.dtype == nf.DType(dtype) and ys.dtype == nf.DType(dtype)
        assert_close(c, th_final, dtype)
        assert_close(ys, tys, dtype)

    expect_fallback("the C backend has no float16/bfloat16" if backend == "cpu" and dtype in _HALVES else None,
                    check)
