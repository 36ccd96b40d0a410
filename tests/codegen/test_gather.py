"""gather / scatter_add (and index_select, take_along_axis) on every backend: forward and gradients against torch,
float64 finite differences, a gather inside a scan (its backward is a scatter-add in the reversed scan), and the
errors bad indices and shapes give."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nnforge as nf

# float64: both sides gather exact values and sum the same few terms; 1e-12 is thousands of ulps of room.
# float32: the scatter-add sums up to ~8 products per element in float32 on both sides, maybe in another order.
TOL = {np.float64: 1e-12, np.float32: 1e-5}


def _close(a, b, dt):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=TOL[dt], atol=TOL[dt])


CASES = [  # x shape, axis, index shape (repeated indices guaranteed by drawing more than the axis holds)
    ((5, 7), 1, (5, 9)),
    ((6, 4), 0, (9, 4)),
    ((3, 4, 5), 2, (3, 4, 8)),
    ((3, 4, 5), 1, (3, 6, 5)),
    ((3, 4, 5), 0, (2, 3, 4)),  # smaller than x off the axis (torch allows it)
]


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("idt", [np.int32, np.int64])
@pytest.mark.parametrize(("shape", "axis", "ishape"), CASES)
def test_gather_matches_torch(backend, rng, shape, axis, ishape, dt, idt):
    x = rng.standard_normal(shape).astype(dt)
    index = rng.integers(0, shape[axis], ishape).astype(idt)
    w = rng.standard_normal(ishape).astype(dt)

    def f(x, index, w):
        y = nf.gather(x, axis, index)
        return y, nf.grad(lambda x: (nf.gather(x, axis, index) * w).sum())(x)

    y, g = nf.compile(f, backend=backend)(x, index, w)
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.gather(tx, axis, torch.tensor(index.astype(np.int64)))
    (ty * torch.tensor(w)).sum().backward()
    assert y.dtype == dt and y.shape == ishape
    np.testing.assert_array_equal(y, ty.detach().numpy())  # a gather copies values: exact
    _close(g, tx.grad.numpy(), dt)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize(("shape", "axis", "ishape"), CASES)
def test_scatter_add_matches_torch(backend, rng, shape, axis, ishape, dt):
    base = rng.standard_normal(shape).astype(dt)
    src = rng.standard_normal(ishape).astype(dt)
    index = rng.integers(0, shape[axis], ishape)
    w = rng.standard_normal(shape).astype(dt)

    def f(base, src, index, w):
        out = nf.scatter_add(base, axis, index, src)
        gb, gs = nf.grad(lambda b, s: (nf.scatter_add(b, axis, index, s) * w).sum(), argnums=(0, 1))(base, src)
        return out, gb, gs

    out, gb, gs = nf.compile(f, backend=backend)(base, src, index, w)
    tb, ts = torch.tensor(base, requires_grad=True), torch.tensor(src, requires_grad=True)
    tout = torch.scatter_add(tb, axis, torch.tensor(index), ts)
    (tout * torch.tensor(w)).sum().backward()
    _close(out, tout.detach().numpy(), dt)
    _close(gb, tb.grad.numpy(), dt)
    _close(gs, ts.grad.numpy(), dt)


def test_index_select_and_take_along_axis_match_torch_and_numpy(backend, rng):
    x = rng.standard_normal((4, 6, 3))
    sel = np.array([5, 0, 5, 2])
    along = rng.integers(0, 6, (1, 8, 3))  # broadcasts over axis 0

    def f(x, w):
        a, b = nf.index_select(x, 1, sel), nf.take_along_axis(x, along, 1)
        return a, b, nf.grad(lambda x: (nf.index_select(x, 1, sel) * w).sum())(x)

    w = rng.standard_normal((4, 4, 3))
    a, b, g = nf.compile(f, backend=backend)(x, w)
    tx = torch.tensor(x, requires_grad=True)
    (torch.index_select(tx, 1, torch.tensor(sel)) * torch.tensor(w)).sum().backward()
    np.testing.assert_array_equal(a, np.take(x, sel, axis=1))
    np.testing.assert_array_equal(b, np.take_along_axis(x, along, axis=1))
    _close(g, tx.grad.numpy(), np.float64)


def _fd(fn, x, h=1e-6):
    out = np.zeros_like(x)
    for i in np.ndindex(*x.shape):
        p, m = x.copy(), x.copy()
        p[i] += h
        m[i] -= h
        out[i] = (fn(p) - fn(m)) / (2 * h)
    return out


def test_gather_and_scatter_add_gradients_match_finite_differences(backend, rng):
    """A composite where every element's gradient mixes gather and scatter-add paths (float64, h = 1e-6:
    truncation ~1e-12, round-off ~1e-10; 1e-6 catches any wrong rule)."""
    x = rng.standard_normal((4, 5))
    i1, i2 = rng.integers(0, 5, (4, 7)), rng.integers(0, 7, (4, 3))

    def loss(x):
        y = nf.gather(x, 1, i1).tanh()                     # [4, 7]
        z = nf.scatter_add(nf.zeros(4, 7, dtype=nf.float64), 1, i1, nf.gather(x, 1, i1) ** 2)
        return (nf.gather(y * z + y, 1, i2) ** 2).sum()

    g = nf.compile(nf.grad(loss), backend=backend)(x)
    value = nf.compile(loss, backend=backend)
    np.testing.assert_allclose(g, _fd(lambda v: float(value(v)), x), rtol=1e-6, atol=1e-6)


def test_gather_in_a_scan_and_its_backward(backend, rng):
    """A lattice step (alpha[s] = logsumexp_k alpha[prev[s, k]] + m[t, s, k]) as a scan: the forward gathers, the
    reversed scan of the gradient scatter-adds. Compared with torch autograd on the same recursion."""
    T, N, S, K = 5, 3, 6, 3
    m = rng.standard_normal((T, N, S, K))
    prev = rng.integers(0, S, (S, K))

    def logz(m):
        idx = nf.tensor(prev).reshape(1, S * K).expand(N, S * K)

        def step(a, m_t):
            a = (nf.gather(a, 1, idx).reshape(N, S, K) + m_t).logsumexp(-1)
            return a, a

        a, _ = nf.scan(step, nf.zeros(N, S, dtype=nf.float64), m)
        return a.logsumexp(-1).sum()

    value, g = nf.compile(nf.value_and_grad(logz), backend=backend)(m)
    tm = torch.tensor(m, requires_grad=True)
    a = torch.zeros(N, S, dtype=torch.float64)
    for t in range(T):
        a = torch.logsumexp(a[:, torch.tensor(prev)] + tm[t], -1)
    want = torch.logsumexp(a, -1).sum()
    want.backward()
    _close(value, want.item(), np.float64)
    _close(g, tm.grad.numpy(), np.float64)


def test_bad_shapes_and_dtypes_are_named():
    x = nf.tensor(np.arange(12.0).reshape(3, 4))
    with pytest.raises(nf.ShapeError, match=r"gather: index \[3\] must have the rank of x \[3, 4\]"):
        nf.gather(x, 1, [0, 1, 2])
    with pytest.raises(nf.ShapeError, match=r"gather: index \[4, 2\] is larger than x \[3, 4\] off axis 1"):
        nf.gather(x, 1, np.zeros((4, 2), np.int64))
    with pytest.raises(nf.DTypeError, match=r"gather: index must be an int32 or int64 tensor, got nf\.float32"):
        nf.gather(x, 1, nf.zeros(3, 2))
    with pytest.raises(nf.ShapeError, match="axis 2 out of range"):
        nf.gather(x, 2, np.zeros((3, 2), np.int64))
    with pytest.raises(nf.ShapeError, match=r"index_select: index must be 1-d, got \[1, 2\]"):
        nf.index_select(x, 0, [[0, 1]])
    with pytest.raises(nf.DTypeError, match=r"scatter_add: src is nf\.float64 but x is nf\.float32"):
        nf.scatter_add(nf.zeros(3, 4), 1, np.zeros((3, 2), np.int64), nf.tensor(np.ones((3, 2))))


def test_constant_out_of_range_index_fails_where_it_is_built():
    x = nf.tensor(np.arange(12.0).reshape(3, 4))
    with pytest.raises(nf.ShapeError, match=r"gather: index 4 at position \[1, 0\] is out of range for size 4 "
                                            r"along axis 1 \(at .*test_gather.py"):
        nf.gather(x, 1, [[0], [4], [1]])
    with pytest.raises(nf.ShapeError, match=r"index_select: index -1 at position \[0\] is out of range for size 3"):
        nf.index_select(x, 0, [-1])
    with pytest.raises(nf.ShapeError, match=r"scatter_add: index 3 at position \[0, 1\] is out of range for size 3"):
        nf.scatter_add(x, 0, [[0, 3]], [[1.0, 2.0]])


def test_runtime_out_of_range_index(backend):
    """A computed index is checked when the program runs on the reference backend; compiled C has no error
    channel, so its gather reads NaN there (visible in any loss) and its scatter-add drops the element."""
    f = nf.compile(lambda x, i: nf.gather(x, 0, i), backend=backend)
    s = nf.compile(lambda x, i: nf.scatter_add(nf.zeros(3, dtype=nf.float64), 0, i, x), backend=backend)
    x = np.array([1.0, 2.0, 3.0])
    bad = np.array([2, 3, 0])
    if backend == "reference":
        with pytest.raises(nf.NNForgeError, match=r"gather: index 3 at position \[1\] is out of range for size 3"):
            f(x, bad)
        with pytest.raises(nf.NNForgeError, match=r"scatter_add: index 3 at position \[1\] is out of range"):
            s(x, bad)
    else:
        out = f(x, bad)
        assert out[0] == 3.0 and np.isnan(out[1]) and out[2] == 1.0
        np.testing.assert_array_equal(s(x, bad), [3.0, 0.0, 1.0])


def _scan_notes(fn, *args) -> list[str]:
    from nnforge.codegen.c import lower, prepare

    return [k.note for k in lower(prepare(nf.compile(fn).trace(*args))).listing if k.kind == "scan"]


@pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")
def test_lattice_scans_split_by_rows_unless_the_index_crosses_rows(rng):
    """A gather (forward) and a scatter-add (its reversed scan) along a non-batch axis keep rows independent:
    both scans run with the batch rows split among the threads, same values as the reference; gathering
    along the batch axis mixes rows and stays work-shared."""
    T, N, S, K = 6, 16, 8, 3
    m = rng.standard_normal((T, N, S, K))
    prev = rng.integers(0, S, (S, K))

    def logz(m):
        idx = nf.tensor(prev).reshape(1, S * K).expand(N, S * K)

        def step(a, m_t):
            return (nf.gather(a, 1, idx).reshape(N, S, K) + m_t).logsumexp(-1), ()

        a, _ = nf.scan(step, nf.zeros(N, S, dtype=nf.float64), m)
        return a.logsumexp(-1).sum()

    f = nf.value_and_grad(logz)
    notes = _scan_notes(f, m)
    assert len(notes) == 2 and all("batch rows split" in n for n in notes), notes
    for got, want in zip(nf.compile(f, backend="cpu")(m), nf.compile(f)(m)):
        _close(got, want, np.float64)

    perm = rng.permutation(N)

    def across_rows(x):
        order = nf.tensor(perm).reshape(N, 1).expand(N, S)
        h, _ = nf.scan(lambda h, x_t: (nf.gather(h, 0, order) * 0.5 + x_t, ()), nf.zeros(N, S, dtype=nf.float64), x)
        return h

    x = rng.standard_normal((T, N, S))
    assert "batch rows split" not in _scan_notes(across_rows, x)[0]
    _close(nf.compile(across_rows, backend="cpu")(x), nf.compile(across_rows)(x), np.float64)


def test_gather_of_a_step_input_feeding_a_matmul_is_hoisted(backend, rng):
    """A scan body gathering from its step input before a matmul: the hoisting pass lifts both out of the loop
    (one matmul over all steps), the gather's axis moving past the new time axis. Value and gradient vs torch."""
    T, N, C, K, H = 5, 3, 4, 6, 2
    x, w = rng.standard_normal((T, N, C)), rng.standard_normal((H, K))
    idx = rng.integers(0, C, (N, K))

    def f(x, w):
        def step(h, x_t):
            y = nf.gather(x_t, 1, idx) @ w.T
            return (h + y).tanh(), y

        h, ys = nf.scan(step, nf.zeros(N, H, dtype=nf.float64), x)
        return (h ** 2).sum() + (ys * ys).sum()

    value, (gx, gw) = nf.compile(nf.value_and_grad(f, argnums=(0, 1)), backend=backend)(x, w)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    h, total = torch.zeros(N, H, dtype=torch.float64), 0
    for t in range(T):
        y = torch.gather(tx[t], 1, torch.tensor(idx)) @ tw.T
        h = torch.tanh(h + y)
        total = total + (y * y).sum()
    want = (h ** 2).sum() + total
    want.backward()
    _close(value, want.item(), np.float64)
    _close(gx, tx.grad.numpy(), np.float64)
    _close(gw, tw.grad.numpy(), np.float64)
