"""The op matrix on every backend: each result checked against numpy, float32 and float64."""

from __future__ import annotations

import numpy as np
import pytest

import nnforge as nf


def _run(backend: str, fn, *args):
    return nf.compile(fn, backend=backend)(*args)


def _close(got, want, dt=np.float32):
    tol = 1e-5 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64),
                               rtol=tol * 10, atol=tol)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_unary_and_binary(backend, dt):
    rng = np.random.default_rng(0)
    x = rng.uniform(0.1, 2.0, (3, 5)).astype(dt)
    y = rng.standard_normal((3, 5)).astype(dt)

    def f(x, y):
        return (nf.exp(y), nf.log(x), nf.sqrt(x), x.reciprocal(), nf.sin(y), nf.cos(y), nf.tanh(y * 4),
                nf.sigmoid(y * 8), nf.abs(y), nf.sign(y), -y, x + y, x - y, x * y, x / y, x ** y,
                nf.maximum(x, y), nf.minimum(x, y), nf.where(y > 0, x, y), (x < y).cast(dt), (x <= y).cast(dt),
                (x == x).cast(dt), (x != y).cast(dt))

    want = (np.exp(y), np.log(x), np.sqrt(x), 1 / x, np.sin(y), np.cos(y), np.tanh(y * 4),
            1 / (1 + np.exp(-y * 8)), np.abs(y), np.sign(y), -y, x + y, x - y, x * y, x / y, x ** y,
            np.maximum(x, y), np.minimum(x, y), np.where(y > 0, x, y), x < y, x <= y, x == x, x != y)
    for got, w in zip(_run(backend, f, x, y), want):
        _close(got, w, dt)


def test_integers_and_bools(backend):
    a = np.array([[-7, -3, 0, 5, 9]], dtype=np.int64)
    b = np.array([[2, -2, 3, 0, 4]], dtype=np.int64)

    def f(a, b):
        return a * b, a - b, nf.abs(a), nf.sign(a), nf.maximum(a, b), (a < b) | (a > 3), a.cast(nf.int32) + 1

    got = _run(backend, f, a, b)
    with np.errstate(divide="ignore"):
        want = (a * b, a - b, np.abs(a), np.sign(a), np.maximum(a, b), (a < b) | (a > 3),
                a.astype(np.int32) + 1)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
        assert g.dtype == w.dtype


def test_nan_and_inf(backend):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -50.0, 50.0], dtype=np.float32)

    def f(x):
        return nf.maximum(x, 0.0), nf.sigmoid(x), nf.tanh(x), x.max(0)

    got = _run(backend, f, x)
    np.testing.assert_array_equal(got[0], np.maximum(x, 0))
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(got[1], 1 / (1 + np.exp(-x.astype(np.float64))), atol=1e-7)
    np.testing.assert_allclose(got[2], np.tanh(x), atol=1e-7)
    assert np.isnan(got[3])


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_reductions(backend, dt):
    x = np.random.default_rng(1).standard_normal((4, 5, 6)).astype(dt)

    def f(x):
        return (x.sum(), x.sum(0), x.sum((0, 2), keepdims=True), x.max(-1), x.mean(1), x.max(1, keepdims=True),
                x.softmax(-1), x.logsumexp(0))

    m = x.max(0, keepdims=True)
    want = (x.sum(), x.sum(0), x.sum((0, 2), keepdims=True), x.max(-1), x.mean(1), x.max(1, keepdims=True),
            np.exp(x) / np.exp(x).sum(-1, keepdims=True), np.log(np.exp(x - m).sum(0)) + m[0])
    for g, w in zip(_run(backend, f, x), want):
        _close(g, w, dt)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_matmul(backend, dt):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((13, 21)).astype(dt)
    b = rng.standard_normal((21, 35)).astype(dt)
    c = rng.standard_normal((3, 13, 21)).astype(dt)
    v = rng.standard_normal(21).astype(dt)

    def f(a, b, c, v):
        return a @ b, a.T.T @ b, (b.T @ a.T), c @ b, a @ v, nf.relu(a @ b + 1.0) * 2, c.permute(0, 2, 1).mT @ b

    want = (a @ b, a @ b, b.T @ a.T, c @ b, a @ v, np.maximum(a @ b + 1, 0) * 2, c @ b)
    for g, w in zip(_run(backend, f, a, b, c, v), want):
        _close(g, w, dt)


def test_movement(backend):
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)

    def f(x):
        return (x.reshape(6, 4) + 0, x.permute(2, 0, 1) * 1, x[:, 1:, ::2] + 0, x[::-1, :, ::-2] + 0,
                x.pad(((1, 0), (0, 2), (1, 1)), value=-1.0) + 0, nf.concat([x, x * 2], axis=1) + 0,
                x[:, :1].expand(2, 5, 4) + 0, x.reshape(4, 6).T + 0, nf.stack([x[0], x[1]], 0).flip(2) + 1)

    want = (x.reshape(6, 4), x.transpose(2, 0, 1), x[:, 1:, ::2], x[::-1, :, ::-2],
            np.pad(x, ((1, 0), (0, 2), (1, 1)), constant_values=-1), np.concatenate([x, x * 2], 1),
            np.broadcast_to(x[:, :1], (2, 5, 4)), x.reshape(4, 6).T, np.stack([x[0], x[1]], 0)[:, :, ::-1] + 1)
    for g, w in zip(_run(backend, f, x), want):
        np.testing.assert_array_equal(g, w)


def test_outputs_alias_inputs(backend):
    x = np.ones((2, 3), np.float32)

    def f(x):
        y = x * 2
        return x, y, y, x.T

    got = _run(backend, f, x)
    np.testing.assert_array_equal(got[0], x)
    np.testing.assert_array_equal(got[1], x * 2)
    np.testing.assert_array_equal(got[2], x * 2)
    np.testing.assert_array_equal(got[3], x.T)


def test_captured_constants(backend):
    w = np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32)

    def f(x):
        return x @ nf.tensor(w) + nf.tensor(np.arange(4, dtype=np.float32))

    x = np.ones((2, 4), np.float32)
    _close(_run(backend, f, x), x @ w + np.arange(4))
