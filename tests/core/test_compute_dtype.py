"""``nf.compile(fn, dtype=...)``: a function written and called in float32 runs in half precision.

The floating-point array arguments are cast as the program reads them, so the program must equal, bit for bit,
the same function compiled without ``dtype`` and called on arguments cast beforehand; integer arrays and Python
scalars pass unchanged; gradients taken through the compiled function come back in the arguments' dtype.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nnforge as nf
from nnforge.nn.rnn import lstm_layer

from .compiled import skip_where_unrunnable
from .utils import assert_close, np_dtype, to_torch


def lstm(x, h0, c0, w_ih, w_hh, b, steps):
    """An LSTM layer over the steps of ``x`` that ``steps`` (an integer array) picks."""
    ys, h, c = lstm_layer(nf.index_select(x, 0, steps), h0, c0, w_ih, w_hh, b, None)
    return ys * 0.5, h, c


def _args(rng: np.random.Generator, T: int = 5, N: int = 3, I: int = 6, H: int = 8) -> list[np.ndarray]:
    shapes = [(T, N, I), (N, H), (N, H), (4 * H, I), (4 * H, H), (4 * H,)]
    return [(rng.standard_normal(s) * 0.5).astype(np.float32) for s in shapes] + [np.array([0, 2, 3, 4])]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_float32_call_runs_as_if_its_arguments_were_cast(backend: str, dtype: str, rng: np.random.Generator):
    """Compiled with ``dtype``, float32 arguments give the results of the same function compiled without it on
    arguments cast to ``dtype`` first — the same bits, in ``dtype`` — while the integer steps stay integers (an
    index cast to half precision would not index); and both are torch's float32 LSTM within ``dtype``'s
    tolerance."""
    skip_where_unrunnable(backend, dtype)
    args = _args(rng)
    got = nf.compile(lstm, backend=backend, dtype=dtype)(*args)
    cast = [a.astype(np_dtype(dtype)) for a in args[:-1]] + [args[-1]]
    want = nf.compile(lstm, backend=backend)(*cast)
    for g, w in zip(got, want):
        assert g.dtype == np_dtype(dtype)
        np.testing.assert_array_equal(g.astype(np.float32), w.astype(np.float32))
    x, h0, c0, w_ih, w_hh, b, steps = (torch.from_numpy(a) for a in args)
    ref = torch.nn.LSTM(6, 8)
    with torch.no_grad():
        for p, v in zip(ref.parameters(), (w_ih, w_hh, b, torch.zeros_like(b))):
            p.copy_(v)
        ys, (h, c) = ref(x[steps], (h0[None], c0[None]))
    for g, w in zip(got, (ys * 0.5, h[0], c[0])):
        assert_close(g, w, dtype)


def test_gradients_through_the_compiled_function_come_back_in_the_arguments_dtype(rng: np.random.Generator):
    """torch autograd through a function compiled in float16 gives float32 gradients of the float32 arguments:
    the float16 gradients of the cast values, widened (the cast's own gradient). A compiled ``nf.grad`` casts
    its own arguments, so its gradients are float16: the same values."""
    args = _args(rng)
    cf = nf.compile(lstm, dtype=nf.float16)

    def loss(*a):
        ys, h, c = lstm(*a)
        return (ys.float() ** 2).sum() + (h * c).float().sum()

    leaves = [to_torch(a, requires_grad=True) for a in args[:6]]
    ys, h, c = cf(*leaves, torch.from_numpy(args[6]))
    assert ys.dtype == torch.float16
    ((ys.float() ** 2).sum() + (h * c).float().sum()).backward()
    compiled = nf.compile(nf.grad(loss, argnums=tuple(range(6))), dtype=nf.float16)(*args)
    for t, g in zip(leaves, compiled):
        assert t.grad.dtype == torch.float32 and g.dtype == np.float16
        np.testing.assert_array_equal(t.grad.numpy(), g.astype(np.float32))


def test_inlined_in_another_trace_it_reads_its_arguments_in_its_dtype(rng: np.random.Generator):
    """Called while another function is traced, the compiled function is inlined with its arguments cast:
    the caller's float32 values reach it as float16, and its results are those it gives alone."""
    args = _args(rng)
    cf = nf.compile(lstm, dtype=nf.float16)
    outer = nf.compile(lambda *a: cf(*a)[0] * 1.0)(*args)
    assert outer.dtype == np.float16
    np.testing.assert_array_equal(outer, cf(*args)[0])


def test_a_compute_dtype_that_is_not_a_float_is_refused():
    for bad in (nf.int32, "half?", np.int64):
        with pytest.raises(ValueError, match="dtype must be a floating-point dtype"):
            nf.compile(lstm, dtype=bad)


def test_a_saved_function_converts_its_arguments_after_loading(backend: str, rng: np.random.Generator,
                                                               tmp_path) -> None:
    """The file keeps the compute dtype: the loaded function takes the same float32 arguments and gives the same
    float16 results, at another sequence length too (six steps where it was saved with four), without
    tracing."""
    f = nf.compile(lstm, backend=backend, dtype=nf.float16)
    f(*_args(rng))
    f.save(tmp_path / "lstm.nfp")
    g = nf.load(tmp_path / "lstm.nfp")
    args = _args(rng)
    args[-1] = np.array([4, 1, 0, 2, 3, 1])  # six steps: the scan's length is the index's
    for a, b in zip(g(*args), f(*args)):
        assert a.dtype == np.float16
        np.testing.assert_array_equal(a, b)
    assert g.trace_count == 0
