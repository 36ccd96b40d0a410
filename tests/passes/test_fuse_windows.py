"""Fusion of a value its kernel reads through overlapping windows (a convolution's im2col reads each input
element once per tap that covers it): a non-cheap value is stored once instead of being evaluated per window;
disjoint windows (an LSTM's gate slices) and cheap values stay fused. Checked on the grouping and against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nnforge as nf
from nnforge.ir.ops import Op
from nnforge.nn.functional import conv1d
from nnforge.passes.fuse import group


def _conv(stride: int, k: int, act):
    def fn(x, w, b):
        return conv1d(act(x), w, b, stride=stride, padding=k // 2)

    return fn


def _args(rng: np.random.Generator, k: int):
    return (rng.standard_normal((3, 4, 50)).astype(np.float32), rng.standard_normal((6, 4, k)).astype(np.float32),
            rng.standard_normal(6).astype(np.float32))


@pytest.mark.parametrize("stride,k,stored", [(5, 19, True), (1, 3, True), (2, 1, False)])
def test_a_swish_read_by_overlapping_taps_is_stored_once(rng: np.random.Generator, backend: str, stride: int,
                                                          k: int, stored: bool) -> None:
    """swish(x) under a Conv1d: taps 19 with stride 5 read each element 3.8 times, taps 3 with stride 1 three
    times: stored once (the refusal says why); one tap reads each element at most once: fused into the gather."""
    fn, args = _conv(stride, k, nf.silu), _args(rng, k)
    graph = nf.compile(fn).trace(*args)
    g = group(graph)
    (swish,) = [n for n in graph.order if n.op == Op.MUL and n.srcs[1].op == Op.SIGMOID]
    assert g.is_stored(swish) == stored
    assert any("overlapping windows" in r for r in g.refusals) == stored
    tx, tw, tb = (torch.from_numpy(a).double() for a in args)
    want = torch.nn.functional.conv1d(torch.nn.functional.silu(tx), tw, tb, stride=stride, padding=k // 2).numpy()
    np.testing.assert_allclose(nf.compile(fn, backend=backend)(*args), want, rtol=2e-5, atol=2e-5)


def test_cheap_values_and_disjoint_windows_stay_fused(rng: np.random.Generator, backend: str) -> None:
    """``2 x`` under the same taps is cheap (recomputed per window, as before); ``tanh`` of a row read through
    four disjoint column slices (an LSTM's gates) is evaluated once per element and fuses."""
    graph = nf.compile(_conv(5, 19, lambda x: x * 2.0)).trace(*_args(rng, 19))
    g = group(graph)
    (double,) = [n for n in graph.order if n.op == Op.MUL]
    assert not g.is_stored(double) and not any("overlapping" in r for r in g.refusals)

    def gates(z):
        t = nf.tanh(z)
        i, f, c, o = t.chunk(4, axis=-1)
        return i * f + c * o

    z = rng.standard_normal((5, 32)).astype(np.float32)
    graph = nf.compile(gates).trace(z)
    g = group(graph)
    (tanh,) = [n for n in graph.order if n.op == Op.TANH]
    assert not g.is_stored(tanh) and not g.refusals
    t = np.tanh(z.astype(np.float64))
    want = t[:, :8] * t[:, 8:16] + t[:, 16:24] * t[:, 24:]
    np.testing.assert_allclose(nf.compile(gates, backend=backend)(z), want, rtol=2e-6, atol=2e-6)


def test_a_single_value_read_twice_is_inlined_not_stored(rng: np.random.Generator, backend: str) -> None:
    """Adam's bias corrections: a step count's cast read by two powers in the update's kernel counts two
    evaluations of one value, not a reason for a kernel of its own."""
    def update(p, m, v, step):
        t = (step + 1).cast(nf.float64)
        return p - m / (1 - 0.9 ** t) / ((v / (1 - 0.999 ** t)).sqrt() + 1e-8)

    p, m = rng.standard_normal((2, 5, 7)).astype(np.float32)
    v, step = np.abs(rng.standard_normal((5, 7))).astype(np.float32), np.int64(rng.integers(0, 9))
    graph = nf.compile(update).trace(p, m, v, step)
    g = group(graph)
    (cast,) = [n for n in graph.order if n.op == Op.CAST and n.ndim == 0]
    assert not g.is_stored(cast) and not any("overlapping" in r for r in g.refusals)
    t = step + 1.0
    want = p - m / (1 - 0.9 ** t) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    np.testing.assert_allclose(nf.compile(update, backend=backend)(p, m, v, step), want, rtol=2e-6, atol=1e-6)
