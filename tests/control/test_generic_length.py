"""A new sequence length re-specializes the cached trace; sizes used as values follow the new length (on every
backend)."""

from __future__ import annotations

import numpy as np

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
