"""A size used as a value (``x.shape[0]`` in arithmetic) that is also a scan's trip count stays a run-time value
in compiled code: a new length reuses the program and must not reuse the traced number."""

from __future__ import annotations

import numpy as np

import nnforge as nf


def test_scan_length_used_as_a_value_follows_the_length(backend):
    def mean_of_running_sum(x):
        c, _ = nf.scan(lambda c, x_t: (c + x_t, ()), nf.zeros(2, dtype=nf.float64), x)
        return c.sum() / nf.full((), x.shape[0], nf.float64)

    f = nf.compile(mean_of_running_sum, backend=backend)
    rng = np.random.default_rng(7)
    for steps in (4, 6, 3):
        x = rng.standard_normal((steps, 2))
        np.testing.assert_allclose(f(x), x.sum() / steps, rtol=1e-12)
    assert f.trace_count == 1
