"""A Python loop over a size unrolls into the trace, so each new length traces again: the user is told why,
once as a warning (at their call) and every time in the log."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

import nnforge as nf


def _unrolled(x):
    acc = x[0]
    for t in range(1, x.shape[0]):
        acc = acc * 0.5 + x[t]
    return acc


def test_a_retrace_for_new_sizes_warns_once_and_logs_each_time(caplog: pytest.LogCaptureFixture,
                                                                rng: np.random.Generator) -> None:
    f = nf.compile(_unrolled)
    f(rng.standard_normal((4, 3)).astype(np.float32))
    with caplog.at_level(logging.INFO, logger="nnforge.compile"), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        f(rng.standard_normal((5, 3)).astype(np.float32))
        f(rng.standard_normal((6, 3)).astype(np.float32))
    assert f.trace_count == 3
    ours = [w for w in seen if "traced again" in str(w.message)]
    assert len(ours) == 1 and ours[0].filename == __file__
    assert "x.shape[0] 4 -> 5" in str(ours[0].message) and "nf.scan" in str(ours[0].message)
    logged = [r.getMessage() for r in caplog.records if "traced again" in r.getMessage()]
    assert len(logged) == 2 and "x.shape[0] 5 -> 6" in logged[1]


def test_a_scan_over_the_length_neither_retraces_nor_warns(rng: np.random.Generator) -> None:
    f = nf.compile(lambda x: nf.scan(lambda c, x_t: (c * 0.5 + x_t, ()), x[0], x[1:])[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in (4, 5, 6):
            f(rng.standard_normal((t, 3)).astype(np.float32))
    assert f.trace_count == 1


def test_a_layer_behind_torch_warns_once_at_the_users_line_naming_its_argument(rng: np.random.Generator) -> None:
    """Behind ``TorchModule`` the trace is of its forward and of the forward and backward as one: one warning,
    naming the argument as the user passed it (not the N-th leaf after the parameters), at the user's line (not
    torch's autograd function)."""
    torch = pytest.importorskip("torch")
    import nnforge.nn as nn
    from nnforge.torch import TorchModule

    torch.manual_seed(int(rng.integers(1 << 31)))
    layer = TorchModule(nn.LSTM(3, 4))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for n in (3, 5):
            layer(torch.randn(6, n, 3, requires_grad=True))[0].sum().backward()
    ours = [w for w in seen if "traced again" in str(w.message)]
    assert len(ours) == 1 and ours[0].filename == __file__, [str(w.message) for w in ours]
    assert "args[0].shape[1] 3 -> 5" in str(ours[0].message)


def test_arguments_are_named_as_the_function_takes_them(rng: np.random.Generator) -> None:
    @nf.compile
    def f(x, state, *rest, scale=None):
        return x.sum(0) + state[1].sum() + rest[0] * scale["a"]

    def call(n: int, m: int) -> None:
        x, s0, s1, r = (rng.standard_normal(s) for s in ((3, n), (2,), (m,), (n,)))
        f(x, (s0, s1), r, scale={"a": rng.standard_normal(n)})

    call(2, 4)
    for n, m, words in ((2, 5, "state[1].shape[0] 4 -> 5"),
                        (3, 5, "x.shape[1] 2 -> 3, rest[0].shape[0] 2 -> 3, scale['a'].shape[0] 2 -> 3")):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            f._warned_retrace = False
            call(n, m)
        assert words in str(seen[0].message), str(seen[0].message)


def test_a_scan_length_that_changed_too_is_not_named_as_a_cause(rng: np.random.Generator) -> None:
    """Only the sizes that made the new trace are named: a scan's length, free in every trace, is not."""
    f = nf.compile(lambda x: nf.scan(lambda c, x_t: (c * 0.5 + x_t, ()), x[0], x[1:])[0].sum(0, keepdims=True)
                   + x[0, : x.shape[1] // 2].sum())
    f(rng.standard_normal((4, 2)).astype(np.float32))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        f(rng.standard_normal((5, 4)).astype(np.float32))
    message = str(next(w.message for w in seen if "traced again" in str(w.message)))
    assert "x.shape[1] 2 -> 4" in message and "shape[0]" not in message, message
