"""Random numbers on every backend (``schedule.Random``: the C prelude's counter-based generator, Triton's Philox,
numpy's generator on the interpreter): their distributions, fresh numbers on every call and every loop iteration,
a repeatable run under ``nf.manual_seed``, and one dropout mask shared by the forward and the backward pass. Each
backend draws other numbers, so values are not compared across backends: each test checks a property the draws
must have, and that a compiled backend drew them in its own code (``compiled.fallback_reason``).

Tolerances: with n independent draws a sample mean is within 5 standard errors (sd / sqrt(n)) of the true mean
with probability 1 - 6e-7, and so for the other moments with their own standard errors."""

from __future__ import annotations

import numpy as np
import pytest

import nnforge as nf
import nnforge.nn.functional as F

from .compiled import fallback_reason


def _compiled(fn, backend: str):
    """``fn`` compiled for ``backend``; every call checks that it ran as the backend's code (the interpreter's
    draws would pass these tests too)."""
    cf = nf.compile(fn, backend=backend)

    def call(*args):
        out = cf(*args)
        assert fallback_reason(cf, backend) is None
        return out

    return call


def _draws(x):
    return nf.rand(*x.shape), nf.randn(*x.shape), nf.rand(*x.shape, dtype=nf.float64)


def test_draws_have_their_distributions(rng: np.random.Generator, backend: str) -> None:
    x = rng.standard_normal((256, 512)).astype(np.float32)
    assert nf.show(_draws, x, stage="scheduled").count("rand -> ") == 3  # scheduled as kernels of their own
    u, z, u64 = _compiled(_draws, backend)(x)
    n = x.size
    assert u.dtype == np.float32 and z.dtype == np.float32 and u64.dtype == np.float64
    for v in (u, u64):
        assert v.min() >= 0.0 and v.max() < 1.0
        assert abs(v.mean() - 0.5) < 5 * (1 / 12) ** 0.5 / n**0.5
        assert abs(v.var() - 1 / 12) < 5 * (1 / 180) ** 0.5 / n**0.5  # var of (u - 1/2)^2 = 1/80 - 1/144
        hist = np.histogram(v, bins=16, range=(0.0, 1.0))[0]  # each bin n / 16, binomial spread
        assert np.abs(hist - n / 16).max() < 5 * (n / 16 * 15 / 16) ** 0.5
    assert abs(z.mean()) < 5 / n**0.5 and abs(z.var() - 1.0) < 5 * 2**0.5 / n**0.5
    assert abs(np.mean(z**3)) < 5 * 15**0.5 / n**0.5  # symmetric: E z^3 = 0, var z^3 = 15
    assert abs(np.mean(np.abs(z) > 1.96) - 0.05) < 5 * (0.05 * 0.95 / n) ** 0.5  # the tails of a normal
    # the three draws, and neighbouring elements, are independent of each other
    for a, b in ((u, u64), (u, z), (u[:, :-1], u[:, 1:]), (u[:-1], u[1:])):
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 5 / n**0.5


def test_every_call_and_every_iteration_draws_afresh(rng: np.random.Generator, backend: str) -> None:
    def noisy(x):
        def step(h, x_t):
            h = h + nf.rand(*x_t.shape) * x_t
            return h, h

        return nf.scan(step, nf.zeros(x.shape[1:]), x)[1]

    x = np.ones((40, 8, 64), np.float32)
    fn = _compiled(noisy, backend)
    a, b = fn(x), fn(x)
    steps = np.diff(np.concatenate([np.zeros((1, 8, 64), np.float32), a]), axis=0)  # each step's draw
    assert steps.min() >= 0.0 and steps.max() < 1.0 + 1e-5
    flat = steps.reshape(40, -1)
    corr = np.corrcoef(flat)[np.triu_indices(40, 1)]  # no two steps alike
    assert np.abs(corr).max() < 5 / flat.shape[1] ** 0.5
    assert not np.array_equal(a, b)
    longer = fn(np.ones((41, 8, 64), np.float32))  # a new length: the same program
    assert longer.shape == (41, 8, 64)


def test_manual_seed_repeats_a_run(rng: np.random.Generator, backend: str) -> None:
    x = rng.standard_normal((32, 48)).astype(np.float32)
    fn = _compiled(lambda x: F.dropout(x, 0.3), backend)
    seed = int(rng.integers(1 << 31))
    nf.manual_seed(seed)
    first = [fn(x) for _ in range(3)]
    nf.manual_seed(seed)
    again = [fn(x) for _ in range(3)]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], first[1])


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_mask_is_shared_by_forward_and_backward(rng: np.random.Generator, p: float, backend: str) -> None:
    """The gradient of sum(dropout(x @ w) * c) with respect to w is x^T (c * mask / (1 - p)), with the mask the
    forward pass drew (read off its output: x @ w has no zeros); also through a scan whose step drops out."""
    x = rng.standard_normal((64, 32)).astype(np.float32)
    w = rng.standard_normal((32, 48)).astype(np.float32)
    c = rng.standard_normal((64, 48)).astype(np.float32)

    def loss(w):
        y = F.dropout(x @ w, p)
        return (y * c).sum(), y

    (_, y), gw = _compiled(nf.value_and_grad(loss, has_aux=True), backend)(w)
    keep = y != 0
    assert abs(keep.mean() - (1 - p)) < 5 * (p * (1 - p) / keep.size) ** 0.5
    np.testing.assert_allclose(y[keep], (x @ w)[keep] / (1 - p), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw, x.T @ (c * keep / (1 - p)), rtol=1e-4, atol=1e-4)

    xs = rng.standard_normal((12, 16, 32)).astype(np.float32)

    def scanned(w):
        def step(h, x_t):
            y = F.dropout(x_t @ w, p)
            return h + y.sum(0), y

        h, ys = nf.scan(step, nf.zeros((48,)), xs)
        return (ys * ys).sum() + h.sum(), ys

    (_, ys), gw = _compiled(nf.value_and_grad(scanned, has_aux=True), backend)(w)
    keep = ys != 0
    pre = np.einsum("tni,io->tno", xs, w)
    np.testing.assert_allclose(ys[keep], pre[keep] / (1 - p), rtol=1e-4, atol=1e-4)
    dy = (2 * ys + 1) * keep / (1 - p)
    np.testing.assert_allclose(gw, np.einsum("tni,tno->io", xs, dy), rtol=1e-3, atol=1e-3)


def test_a_saved_program_draws_afresh_after_loading(rng: np.random.Generator, tmp_path, backend: str) -> None:
    if backend == "reference":
        pytest.skip("the interpreter has no compiled program to save")
    x = rng.standard_normal((8, 16)).astype(np.float32)
    fn = nf.compile(lambda x: x * nf.rand(*x.shape), backend=backend)
    fn(x)
    assert fallback_reason(fn, backend) is None
    fn.save(tmp_path / "draws.nfp")
    loaded = nf.load(tmp_path / "draws.nfp")
    seed = int(rng.integers(1 << 31))
    nf.manual_seed(seed)
    a, b = loaded(x), loaded(x)
    assert not np.array_equal(a, b) and np.all(np.abs(a) <= np.abs(x))
    nf.manual_seed(seed)
    np.testing.assert_array_equal(loaded(x), a)
