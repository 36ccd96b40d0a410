"""A new sequence length re-specializes the cached trace; sizes used as values follow the new length (on every
backend)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nnforge as nf


def test_checkpointed_scan_and_mean_over_time_follow_the_length_without_retracing(rng: np.random.Generator,
                                                                                  backend: str):
    @nf.compile(backend=backend)
    def f(x):
        def cell(c, x_t):
            return c * 0.5 + x_t, c

        c, ys = nf.scan(cell, nf.zeros(x.shape[1]), x, checkpoint_every=3)
        return c / x.shape[0], ys.mean(0), ys[1:]

    for t in (7, 10, 5, 3):
        x = rng.standard_normal((t, 2)).astype(np.float32)
        c, m, tail = f(x)
        carry, ys = np.zeros(2, np.float32), []
        for row in x:
            ys.append(carry)
            carry = carry * 0.5 + row
        ys = np.stack(ys)
        np.testing.assert_allclose(c, carry / t, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m, ys.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(tail, ys[1:], rtol=1e-6)
    assert f.trace_count == 1


@pytest.mark.parametrize("loss", ["mean", "sum * (T - 1)", "var"])
def test_sizes_folded_with_constants_follow_the_length(loss: str, rng: np.random.Generator, backend: str):
    """A mean's ``1 / (T N)`` (in its value and its gradient), a size equal to 1 at the traced length (``T - 1``
    at T = 2) and ``var``'s ``T - 1`` stay sizes through simplification: values and gradients at later lengths
    are those of those lengths, not of the first (an LSTM trained on a mean loss over time got gradients scaled by
    the first length's ratio, with no new trace)."""
    def f(x):
        _, ys = nf.scan(lambda c, x_t: (c + x_t, c + x_t), x[0] * 0, x)
        t = x.shape[0]
        return {"mean": ys.mean(), "sum * (T - 1)": ys.sum() * (t - 1), "var": ys.var(0).sum()}[loss]

    compiled = nf.compile(nf.value_and_grad(f), backend=backend)
    for t in (2, 6, 3):
        x = rng.standard_normal((t, 3))
        value, grad = compiled(x)
        xt = torch.tensor(x, requires_grad=True)
        ys = xt.cumsum(0)
        want = {"mean": ys.mean(), "sum * (T - 1)": ys.sum() * (t - 1), "var": ys.var(0).sum()}[loss]
        want.backward()
        np.testing.assert_allclose(value, want.item(), rtol=1e-12)
        np.testing.assert_allclose(grad, xt.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert compiled.trace_count == 1


def test_a_length_baked_into_a_reshape_stays_in_the_cache_key(rng: np.random.Generator, backend: str):
    @nf.compile(backend=backend)
    def f(x):
        _, ys = nf.scan(lambda c, x_t: (c + x_t, c), nf.zeros(2), x)
        return ys.reshape(int(x.shape[0]) * 2)  # int() drops the symbol: this graph is only valid for one T

    for t in (4, 6):
        x = rng.standard_normal((t, 2)).astype(np.float32)
        out = f(x)
        assert out.shape == (t * 2,)
        np.testing.assert_allclose(out.reshape(t, 2)[1:], np.cumsum(x, 0)[:-1], rtol=1e-5, atol=1e-6)
    assert f.trace_count == 2


def test_a_scan_over_two_sequences_takes_every_length_with_one_trace(rng: np.random.Generator, backend: str):
    """A scan walking (x, mask) reads its trip count from both: their lengths are freed together and must stay
    one size, so new equal lengths (0 included) reuse the trace, and unequal ones get the scan's own error."""

    @nf.compile(backend=backend)
    def f(x, h0, mask):
        def cell(h, xm):
            x_t, m_t = xm
            return h + x_t * m_t, h * m_t

        return nf.scan(cell, h0, (x, mask))

    for t in (5, 1, 8, 0):
        x, h0, mask = (rng.standard_normal(s).astype(np.float32) for s in ((t, 3, 4), (3, 4), (t, 3, 4)))
        h, ys = f(x, h0, mask)
        want_h, want_ys = h0.copy(), []
        for x_t, m_t in zip(x, mask):
            want_ys.append(want_h * m_t)
            want_h = want_h + x_t * m_t
        np.testing.assert_allclose(h, want_h, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ys, np.stack(want_ys) if t else np.zeros((0, 3, 4)), rtol=1e-5, atol=1e-6)
    assert f.trace_count == 1
    with pytest.raises(nf.ShapeError, match="disagree on length"):
        f(*(np.ones(s, np.float32) for s in ((6, 3, 4), (3, 4), (4, 3, 4))))


def test_a_cotangent_of_a_strided_sequence_is_tied_to_its_length_not_made_equal(rng: np.random.Generator,
                                                                                 backend: str):
    """A scan over ``x[::2]`` differentiated with the cotangent as an input walks two sequences whose lengths are
    ``(T + 1) // 2`` and the cotangent's own: the second is tied to the first as that expression (once it was made
    equal to T, which broke every even T), so odd and even lengths alike reuse the one trace, and a cotangent of
    another length is traced again and refused by ``vjp`` in the user's terms."""
    torch = pytest.importorskip("torch")

    def g(x):
        _, ys = nf.scan(lambda c, a: (nf.tanh(c + a),) * 2, x[0] * 0, x[::2])
        return ys.softmax(-1)

    @nf.compile(backend=backend)
    def f(x, ct):
        _, back = nf.vjp(g, x)
        return back(ct)[0]

    for t in (6, 7, 10, 1, 9):
        x, ct = (rng.standard_normal(s).astype(np.float32) for s in ((t, 3), ((t + 1) // 2, 3)))
        xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        c, ys = xt[0] * 0, []
        for a in xt[::2]:
            c = torch.tanh(c + a)
            ys.append(c)
        torch.stack(ys).softmax(-1).backward(torch.tensor(ct, dtype=torch.float64))
        np.testing.assert_allclose(f(x, ct), xt.grad.numpy(), rtol=1e-5, atol=1e-6)  # float32 sums of 3-5 terms
    assert f.trace_count == 1
    with pytest.raises(nf.ShapeError, match=r"cotangent shape \[4, 3\] differs from output shape \[3, 3\]"):
        f(np.ones((6, 3), np.float32), np.ones((4, 3), np.float32))


def test_two_strided_sequences_of_different_lengths_walked_together(rng: np.random.Generator, backend: str):
    """``x[::2]`` and ``y[::2]`` of 5 and 6 rows both have 3: their lengths are two expressions that no one symbol
    writes, so they stay in the cache key (once they were made one size, and a call at 5 and 6 raised)."""

    @nf.compile(backend=backend)
    def f(x, y):
        return nf.scan(lambda c, ab: (c + ab[0] * ab[1], c), x[0] * 0, (x[::2], y[::2]))[1]

    for tx, ty in ((5, 6), (7, 8), (5, 6)):
        x, y = (rng.standard_normal((t, 3)).astype(np.float32) for t in (tx, ty))
        want = np.concatenate([np.zeros((1, 3)), np.cumsum(x[::2] * y[::2], 0)[:-1]])
        np.testing.assert_allclose(f(x, y), want, rtol=1e-6, atol=1e-6)
    assert f.trace_count == 2
