"""The compiled program's call path: sizes read from the inputs per call (shapes planned once), its checks, and
outputs whose shape is an expression of a run-time size."""

from __future__ import annotations

import numpy as np
import pytest
from test_scan import lstm, lstm_args

import nnforge as nf
from nnforge.errors import NNForgeError

pytestmark = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")


def _program(fn, *args):
    from nnforge.codegen.c import CpuBackend

    return CpuBackend()(nf.compile(fn).trace(*args))


def flat_ys(*args):
    ys, h, c = lstm(*args)
    return ys.reshape(-1, ys.shape[-1]), h + c  # [T * N, H]: an expression of the trip count


def test_one_program_serves_every_trip_count_and_checks_its_inputs():
    args = lstm_args(T=5, N=3, I=4, H=6)
    program = _program(flat_ys, *args)
    ref = nf.compile(flat_ys, backend="reference")
    for T in (5, 1, 17):
        a = lstm_args(T=T, N=3, I=4, H=6, seed=T)
        got = program(a)
        assert got[0].shape == (T * 3, 6) and got[1].shape == (3, 6)
        for g, w in zip(got, ref(*a)):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
    with pytest.raises(NNForgeError, match="takes 6 inputs, got 5"):
        program(args[:5])
    bad = list(args)
    bad[1] = np.zeros((4, 6), np.float32)  # batch 4 where the program was built for 3
    with pytest.raises(NNForgeError, match=r"has shape \[4, 6\], expected \[3, 6\]"):
        program(bad)


def test_inputs_that_disagree_on_a_run_time_size_are_refused(rng: np.random.Generator):
    """Two sequences of one scan must have the same length; the error names the input."""
    def two_sequences(x, y, h0, w):
        def cell(h, xy):
            a, b = xy
            return nf.tanh(a + b + h @ w), h

        return nf.scan(cell, h0, (x, y))

    x, y = rng.standard_normal((5, 2, 3)).astype(np.float32), rng.standard_normal((5, 2, 3)).astype(np.float32)
    h0, w = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((3, 3)).astype(np.float32)
    program = _program(two_sequences, x, y, h0, w)
    assert program([x, y, h0, w])[1].shape == (5, 2, 3)
    with pytest.raises(NNForgeError, match=r"disagree on size|'arg1' has shape \[4, 2, 3\], expected \[5, 2, 3\]"):
        program([x, y[:4], h0, w])
