"""``make demo``'s forge part: the basecaller's compiled training step runs on every backend and the backends
agree step by step (same seed, same synthetic reads)."""

from __future__ import annotations

import numpy as np
import pytest

from nnforge.demo import synthetic_reads, train


def test_synthetic_reads_hold_their_labels(rng: np.random.Generator) -> None:
    signal, targets, in_len, tg_len = synthetic_reads(rng, 3, 120, 8)
    assert signal.shape == (3, 1, 120) and targets.shape == (3, 8)
    assert ((targets >= 1) & (targets <= 4)).all() and (in_len == 40).all() and (tg_len == 8).all()
    assert np.abs(signal[0, 0, :5].mean() - [-1.2, -0.4, 0.4, 1.2][targets[0, 0] - 1]) < 0.3


@pytest.mark.whole_model
def test_the_demo_training_step_agrees_across_backends(backend: str) -> None:
    kw = dict(steps=4, batch=4, samples=60, bases=5, hidden=8, layers=2, log_every=100, compare_torch=False)
    ours = train(backend=backend, **kw)
    want = train(backend="reference", **kw)
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, want, rtol=2e-4)
