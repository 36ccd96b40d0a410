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
    assert "arg0.shape[0] 4 -> 5" in str(ours[0].message) and "nf.scan" in str(ours[0].message)
    logged = [r.getMessage() for r in caplog.records if "traced again" in r.getMessage()]
    assert len(logged) == 2 and "arg0.shape[0] 5 -> 6" in logged[1]


def test_a_scan_over_the_length_neither_retraces_nor_warns(rng: np.random.Generator) -> None:
    f = nf.compile(lambda x: nf.scan(lambda c, x_t: (c * 0.5 + x_t, ()), x[0], x[1:])[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in (4, 5, 6):
            f(rng.standard_normal((t, 3)).astype(np.float32))
    assert f.trace_count == 1
